# limit: 90
# Where a replayed decode step's time goes (Qwen3-30B-A3B shapes, 48 layers, context 1024, one H200): the step
# timeline tests, then TPOT at batch 1, 8 and 32 and, per kernel of a layer, the time from its PDL-wait release to
# the next kernel's release (bench_decode_bench --timeline; per-CTA %globaltimer records at every wait).
timeout 25 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaStepTimeline*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
timeout 60 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,32 --steps 30 --warmup 5 \
  --timeline 1,8,32 2>&1 | grep -vE '^sere_reroute alone'
