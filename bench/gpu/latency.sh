# limit: 75
# Low-latency decode kernels (batch 1-16) at Qwen3-30B-A3B shapes on one H200: their tests, then TPOT at batch 1, 8
# and 64 (SERE off and S=2) for the new decode variants against the defaults, and the per-op ablation at batch 1 of
# the first variant. route=1: fused routing (router GEMM + top-k + plan, one cluster launch); gemm=4: small-M GEMM with
# the weight tile bulk-copied into shared memory before the PDL wait.
timeout 25 "$P/test_cuda" --gtest_filter='CudaLatency*:CudaGemmSmallM*:CudaRouter*:CudaMoePlan*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
timeout 48 "$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 100 --warmup 10 --ablate 1 --ablate-steps 10 \
  --variant route=1,gemm=4 --variant gemm=1 --variant route=1 --variant gemm=4 2>&1 | grep -vE '^\| (8|64) \|'
