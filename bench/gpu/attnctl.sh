# limit: 240
# Timeline of the compact cluster attention (kAttentionKernel 10) against the default (8) at batch 1 (timeline package:
# TIMELINE=1 bench/gpu-package.sh): the per-layer table, then the attention launches' phases (resident = phase 0,
# us after their release) and per-SM residency.
for v in 8 10; do
  echo "======== attn=$v"
  ZEST_TIMELINE_RAW=$OUT/tl$v timeout 100 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 \
    --batch 1 --steps 30 --warmup 5 --timeline 1 --variant attn=$v 2>&1 | grep -E '^    \||layer:'
  python3 bench/timeline_raw.py "$OUT/tl$v-b1.txt" --phases decode_attention_fused
  python3 bench/timeline_raw.py "$OUT/tl$v-b1.txt" --sms decode_attention_fused
done
