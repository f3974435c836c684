# limit: 240
# Timeline (timeline package) of kMoeDownRows 3 (gate/up and down-pair kernels at most 64 registers) against 1, both
# with slim=2, attn=11, at batch 1: the per-layer table and the down-pair CTAs per SM.
for v in attn=11,slim=2 attn=11,slim=2,rows=3; do
  echo "======== variant '$v'"
  ZEST_TIMELINE_RAW=$OUT/tl${v:15:1} timeout 100 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 \
    --batch 1 --steps 30 --warmup 5 --timeline 1 --variant $v 2>&1 | grep -E '^    \||layer:'
  python3 bench/timeline_raw.py "$OUT/tl${v:15:1}-b1.txt" --sms moe_one_down_pair
  python3 bench/timeline_raw.py "$OUT/tl${v:15:1}-b1.txt" --sms moe_one_gate_up
done
