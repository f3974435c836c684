# limit: 75
# L2 prefetches in the attention half of a decode layer (DecodeOption::kL2Prefetch, bench variant l2=N): the qkv
# GEMM prefetching the layer's KV rows (1, 2, 4) and the decode attention prefetching the o GEMM's weights (1, 3, 4);
# and the small-M GEMM with 8-row tiles for K > 2048 (gemm=5: the o GEMM's CTAs fit beside the ring attention's).
# Tests of the kernels involved, then TPOT at batch 1/4/8/16 (the options change nothing above 16 rows) for every
# mode in one process, with the in-graph per-op costs (--ablate) at batch 1 and 8 for l2=1.
timeout 25 "$P/test_cuda" --gtest_filter='CudaLatencyGemm*:CudaDecodeAttention.FusedVariants*:CudaLatencyDecoder*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
timeout 45 "$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,4,8,16 --context 1024 --steps 30 --warmup 5 \
  --ablate 1,8 --ablate-steps 8 --variant l2=1 --variant l2=0 --variant l2=2 --variant l2=3 --variant l2=4 \
  --variant gemm=5 --variant gemm=5,l2=1 2>&1 |
  grep --line-buffered -E 'variant|copy|^\| [0-9]|batch [0-9]+: TPOT|gemm |attention|router|experts|combine'
