# limit: 90
# CUDA decode on one H200 at Qwen3-30B-A3B shapes. First the decode kernels' tests, then TPOT per batch with the
# default kernels (200 steps, SERE off and S=2), the per-op cost inside the graph (ablation at batch 1, 8 and 64)
# and sere_reroute alone. Output is flushed per batch, so a cut run still reports.
"$P/test_cuda" --gtest_filter='CudaSere*:CudaDecodeAttention*:CudaGemmSmallM*:CudaSyntheticDecoder*:CudaRouter*:CudaMoe*:CudaRope*:CudaDecoder*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 200 --warmup 20 --ablate 1,8,64 --ablate-steps 10
