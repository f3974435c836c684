# limit: 240
# Timeline (timeline package: TIMELINE=1 bench/gpu-package.sh) of the defaults (kQkvSlim 1, kAttentionKernel 10)
# against the previous ones (slim=0, attn=8) at batch 1: the per-layer table, the attention launches' phases and
# per-SM residency (resident = phase 0, us after their release), then the small-M GEMMs' residency.
for v in "" "attn=8,slim=0"; do
  echo "======== variant '$v'"
  ZEST_TIMELINE_RAW=$OUT/tl${v:+8} timeout 100 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 \
    --batch 1 --steps 30 --warmup 5 --timeline 1 ${v:+--variant $v} 2>&1 | grep -E '^    \||layer:'
  python3 bench/timeline_raw.py "$OUT/tl${v:+8}-b1.txt" --phases decode_attention_fused
  python3 bench/timeline_raw.py "$OUT/tl${v:+8}-b1.txt" --sms decode_attention_fused
  python3 bench/timeline_raw.py "$OUT/tl${v:+8}-b1.txt"
done
