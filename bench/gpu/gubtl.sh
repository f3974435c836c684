# limit: 240
# Step timeline at batch 1 with the gate/up weights through register loads (kMoeGateUpBulk 0) and through
# shared-memory stages (1); per-CTA records in $OUT/tlg<v>-b1.txt (bench/timeline_raw.py --sms moe_one_gate_up).
for v in 0 1; do
  ZEST_TIMELINE_RAW=${OUT:-/tmp}/tlg$v timeout 100 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 \
    --batch 1 --steps 30 --warmup 5 --timeline 1 --variant gub=$v 2>&1 | grep -vE '^sere_reroute alone' | tail -30
done
