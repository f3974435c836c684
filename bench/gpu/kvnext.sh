# limit: 300
# The o GEMM prefetching the next layer's KV rows into L2 as its CTAs finish (kL2Prefetch 6: normal priority, 7:
# evict-last, 8: as 6 at every batch without the qkv GEMM's KV prefetch) against the default (0): the prefetching
# GEMM's test (bit for bit against gemm()), the decoder graph tests, then TPOT at batch 1, 8, 16 and 32, the forms
# alternating in one process (ABBA).
timeout 100 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaLatencyGemm.KvPrefetch*:CudaGraph*:CudaDecoder*:CudaSynthetic*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 180 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,16 --steps 40 --warmup 5 \
  --variant l2=0 --variant l2=6 --variant l2=7 --variant l2=8 --variant l2=8 --variant l2=7 --variant l2=6 --variant l2=0 2>&1
