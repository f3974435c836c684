# limit: 120
# The layer's residual add + RMSNorm folded into the decode routing launch (kRouteNorm 1, moe_route_norm; the combine
# adds the attention output) against the chain add_rmsnorm -> moe_route (kRouteNorm 0), and the one-token experts'
# carveout preference (carve=1: the smallest that holds their CTAs; carve=0: the driver's): the routing tests (bit for
# bit against the chain, and the synthetic decoder's greedy tokens), then TPOT at batch 1 and 8 (SERE off and S=2),
# the forms alternating in one process.
timeout 30 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaRoute*:CudaLatencyRoute*:CudaGraph*:CudaMoeBlock*:CudaMoeOne*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 80 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant rnorm=1,carve=1 --variant rnorm=0,carve=1 --variant rnorm=0,carve=0 --variant rnorm=1,carve=0 \
  --variant rnorm=1,carve=1 --variant rnorm=0,carve=1 2>&1 | grep -vE '^sere_reroute alone'
