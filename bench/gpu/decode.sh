# limit: 90
# CUDA decode on one H200 at Qwen3-30B-A3B shapes. First the decode kernels' tests, then TPOT per batch with
# the per-op cost inside the graph (ablation at batch 1 and 64) with the defaults, then the expert kernels at
# 4 CTAs per SM (moe=2). Output is flushed per batch, so a cut run still reports.
"$P/test_cuda" --gtest_filter='CudaSere*:CudaDecodeAttention*:CudaGemmSmallM*:CudaSyntheticDecoder*:CudaRouter*:CudaMoe*:CudaRope*:CudaDecoder*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 100 --warmup 10 --ablate 1,64 --ablate-steps 10 --variant gemm=1 --variant moe=2
