# limit: 240
# The add + RMSNorm folded into the o GEMM's launch (gemm_add_rmsnorm, nfold=1, default) against the two launches
# (nfold=0), in one process (Qwen3-30B-A3B shapes, context 1024, one H200). First the tests of the kernels and
# decoders involved.
timeout 110 "$P/test_cuda" --gtest_brief=1 \
  --gtest_filter='CudaLatencyGemm*:CudaNorm*:CudaLatencyNorm*:CudaDecoder*:CudaSynthetic*:CudaGraph*:CudaMoeOne*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]|^\[(cuda-vs-cpu|batch-vs-solo)\]' | tail -30
timeout 120 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,32 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant nfold=1 --variant nfold=0 --variant nfold=1 --variant nfold=0 2>&1 | grep -vE '^sere_reroute alone'
