# limit: 90
# CUDA decode on one H200 at Qwen3-30B-A3B shapes: the decode kernels' tests, then TPOT per batch with the
# per-op cost inside the graph (ablation at batch 1 and 64) and the decode variants (l2: L2 prefetch mask,
# splitk: small-M GEMM split over CTAs, moe: expert kernels' occupancy variant), sere_reroute alone.
"$P/test_cuda" --gtest_filter='CudaSere*:CudaDecodeAttention*:CudaGemmSmallM*:CudaSyntheticDecoder*:CudaRouter*:CudaMoe*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 40 --warmup 5 --ablate 1,64 --ablate-steps 20 \
  --variant l2=0 --variant l2=7 --variant splitk=1 --variant moe=1
