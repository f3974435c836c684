# limit: 300
# The add + RMSNorm folded into the decode routing (kRouteAddNorm 1, default) against the separate add_rmsnorm launch
# (0): the routing tests (the fold bit for bit against the chain), the decoder and graph tests, then TPOT at batch 1,
# 8 and 16 (16: above the fold's 8 tokens, a control), SERE off and S=2, the two forms alternating in one process.
timeout 120 "$P/test_cuda" --gtest_brief=1 \
  --gtest_filter='CudaRoute*:CudaGraph*:CudaDecoder*:CudaSynthetic*:CudaMoeBlock*:CudaMoeOne*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 150 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,16 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant radd=1 --variant radd=0 --variant radd=1 --variant radd=0 2>&1 | grep -vE '^sere_reroute alone'
