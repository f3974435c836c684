# limit: 420
# The o GEMM (K = 4096) at 3-16 rows by register streaming, its rows prefetched into L2 before the wait
# (kGemmVariant 10) or not (11), against the shared-memory tile (4, the default): the GEMM tests, then batches 1
# (control: unchanged), 4 and 8 alternating in one process.
"$P/test_cuda" --gtest_filter='CudaLatencyGemm.*:CudaDecoder*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -30
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,4,8,16 --steps 60 --warmup 5 \
  --variant gemm=4 --variant gemm=10 --variant gemm=11 --variant gemm=11 --variant gemm=10 --variant gemm=4 \
  --variant gemm=4 --variant gemm=10 2>&1 | grep "variant:\|^| [0-9]\|error"
