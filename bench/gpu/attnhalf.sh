# limit: 75
# DecodeOption::kL2Prefetch (bench variant l2=N) at batch 1-16, repeated and interleaved to separate the effect from
# the spread between variants of one process: 0 = none; 1 = the qkv GEMM prefetches the layer's KV rows into L2 (dealt
# round-robin over its CTAs; weight tiles evict-first) and the ring attention the o GEMM's weights; 2 = the KV
# prefetch only, plain tiles; gemm=7 (register-streamed qkv GEMM) alone and with l2=1. Then the in-graph per-op costs
# (--ablate) at batch 1 and 8 for l2=0 and for l2=1. Tests of the kernels involved first.
timeout 15 "$P/test_cuda" --gtest_filter='CudaLatencyGemm*:CudaDecodeAttention.FusedVariants*:CudaLatencyDecoder*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
B="$P/bench_decode_bench"
F='variant|copy|^\| [0-9]|batch [0-9]+: TPOT|gemm |attention|router|experts|combine'
timeout 34 "$B" --config qwen3-30b-a3b --batch 1,2,4,8,16 --context 1024 --steps 40 --warmup 5 \
  --variant l2=0 --variant l2=1 --variant l2=2 --variant l2=0 --variant l2=1 --variant l2=2 --variant gemm=7 \
  --variant gemm=7,l2=1 2>&1 | grep --line-buffered -E "$F"
for v in l2=0 l2=1; do
  timeout 11 "$B" --config qwen3-30b-a3b --batch 1,8 --context 1024 --steps 20 --warmup 3 --ablate 1,8 \
    --ablate-steps 8 --variant $v 2>&1 | grep --line-buffered -E "$F"
done
