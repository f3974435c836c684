# limit: 90
# The layer's residual add + RMSNorm folded into the decode routing launch (kRouteNorm 1, moe_route_norm) against the
# chain add_rmsnorm -> moe_route (kRouteNorm 0): the routing tests (bit for bit against the chain, and the synthetic
# decoder's greedy tokens), then TPOT at batch 1 and 8 (SERE off and S=2), the two forms alternating in one process.
timeout 30 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaRoute*:CudaLatencyRoute*:CudaGraph*:CudaMoeBlock*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 55 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant rnorm=1 --variant rnorm=0 --variant rnorm=1 --variant rnorm=0 2>&1 | grep -vE '^sere_reroute alone'
