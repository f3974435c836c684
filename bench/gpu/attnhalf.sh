# limit: 75
# Batch 1-2: kL2Prefetch 5 (the default 0's KV prefetch with evict-first qkv tiles, and the o GEMM's tiles copied
# evict-first as well) against 0 (the default) and 4 (none), repeated and interleaved; then the in-graph per-op costs
# (--ablate) at batch 1 for l2=5. Tests of the kernels involved first.
timeout 15 "$P/test_cuda" --gtest_filter='CudaLatencyGemm*:CudaDecodeAttention.FusedVariants*:CudaLatencyDecoder*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
F='variant|copy|^\| [0-9]|batch [0-9]+: TPOT|gemm |attention|router|experts|combine'
timeout 36 "$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,2 --context 1024 --steps 60 --warmup 5 \
  --variant l2=0 --variant l2=5 --variant l2=4 --variant l2=0 --variant l2=5 --variant l2=4 --variant l2=0 \
  --variant l2=5 2>&1 | grep --line-buffered -E "$F"
timeout 12 "$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1 --context 1024 --steps 30 --warmup 3 --ablate 1 \
  --ablate-steps 8 --variant l2=5 2>&1 | grep --line-buffered -E "$F"
