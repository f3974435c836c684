# limit: 240
# The one-token experts in one launch (moe_one variant 2: experts=18) against the two-kernel form (variant 1, the
# default at batch 1) and the small-M tile GEMM with part of its tile prefetched into L2 before the wait (tilel2=N
# rows; 0 default), in one process (Qwen3-30B-A3B shapes, context 1024, one H200). First the tests of the kernels.
timeout 100 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeOne*:CudaLatencyGemm*:CudaGraph*:CudaDecoder*:CudaSynthetic*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]' | tail -40
timeout 130 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant experts=0 --variant experts=18 --variant tilel2=16 --variant tilel2=8 --variant experts=18,tilel2=16 \
  --variant experts=0 --variant experts=18 2>&1 | grep -vE '^sere_reroute alone'
