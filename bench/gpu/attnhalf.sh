# limit: 75
# The attention half of a decode layer, final defaults: kL2Prefetch 0 (batch 1-2: the qkv GEMM prefetches the
# layer's KV rows into L2, the small-M GEMMs' tiles copied evict-first) and kGemmVariant 4 (the register-streamed qkv
# GEMM at 9-16 rows) against l2=5 (0 without the o GEMM's evict-first tiles) and the defaults before this work
# (l2=4: none; gemm=8: the shared-memory tile at every row count), interleaved, at batch 1-64. Tests first.
timeout 15 "$P/test_cuda" --gtest_filter='CudaLatencyGemm*:CudaDecodeAttention.FusedVariants*:CudaLatencyDecoder*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
timeout 52 "$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,2,8,16,32,64 --context 1024 --steps 30 \
  --warmup 5 --variant l2=0,gemm=4 --variant l2=5,gemm=4 --variant l2=4,gemm=8 --variant l2=0,gemm=4 \
  --variant l2=5,gemm=4 --variant l2=4,gemm=8 2>&1 | grep --line-buffered -E 'variant|copy|^\| [0-9]'
