# limit: 120
# Where a replayed decode step's time goes (Qwen3-30B-A3B shapes, 48 layers, context 1024, one H200), from the
# timeline package (TIMELINE=1 bench/gpu-package.sh; ZEST_PKG=.gpu/zest-timeline.tar.xz bench/gpu-batch.sh ...): the
# step timeline tests, then TPOT at batch 1 and 8 and, per kernel of a layer, the time from its PDL-wait release to
# the next kernel's release and the kernels' phase stamps (bench_decode_timeline --timeline; per-CTA %globaltimer
# records). Extra bench_decode_timeline options (e.g. --pdl 0) come from TIMELINE_ARGS.
timeout 25 "$P/test_cuda_timeline" --gtest_brief=1 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
timeout 90 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 30 --warmup 5 \
  --timeline 1,8 ${TIMELINE_ARGS:-} 2>&1 | grep -vE '^sere_reroute alone'
