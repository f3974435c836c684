# limit: 75
# Decode routing (router GEMM + top-k + plan) at Qwen3-30B-A3B shapes on one H200: the routing tests (compact kernel
# against the cluster kernel and the separate launches, bit for bit; its phase clocks printed), then TPOT at batch 1
# and 8 (SERE off and S=2) for the compact kernel with the routing-independent plan entries written early (route=10,
# the default; with the per-op ablation: its "router (fused)" line is routing's in-graph cost), the compact kernel
# (route=4) and the cluster kernel (route=1).
timeout 25 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaRoute*:CudaLatencyRoute*:CudaRouter*:CudaMoePlan*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 48 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 30 --warmup 5 \
  --ablate 1,8 --ablate-steps 8 --sere-primary 2 --sere-threshold 0 \
  --variant route=10 --variant route=4 --variant route=1 2>&1 | grep -vE '^sere_reroute alone'
