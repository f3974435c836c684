# limit: 420
# The streaming experts' plan cache (DecodeOption::kStreamPlanCache): the streaming-experts tests, then TPOT with the
# cache (pcache=1, default) against without (pcache=0), alternating in one process.
"$P/test_cuda" --gtest_filter='CudaMoeStream*:CudaMoeExperts.Decode*:CudaGraph*' 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | tail -30
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 2,8,32,64 --steps 40 --warmup 5 \
  --variant pcache=0 --variant pcache=1 --variant pcache=0 --variant pcache=1 2>&1 | grep -v "^sere_reroute"
