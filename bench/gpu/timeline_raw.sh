# limit: 150
# The step timeline (bench/gpu/timeline.sh) with every per-CTA record written to $OUT/tl-b<batch>.txt
# (ZEST_TIMELINE_RAW; TL_PREFIX renames it) for offline analysis: which CTAs of each launch became resident late, on which SMs, and what
# else those SMs were running.
ZEST_TIMELINE_RAW=${OUT:-/tmp}/${TL_PREFIX:-tl} timeout 120 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 \
  --batch 1,8 --steps 30 --warmup 5 --timeline 1,8 ${TIMELINE_ARGS:-} 2>&1 | grep -vE '^sere_reroute alone'
