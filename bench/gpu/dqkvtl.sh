# limit: 300
# Step timeline at batch 1 (timeline package: TIMELINE=1 bench/gpu-package.sh) with the next qkv projection in the
# down kernel (DecodeOption::kDownQkv 1) and as its own launch (0): per kernel of a layer the span from its release to
# the next kernel's release, then the down kernel's phases (0 resident, 1 down rows done, 3 past the grid barrier,
# 2 end) and the qkv GEMM's tile landing (rows_pre phase 1) from the per-CTA records.
for v in 0 1; do
  echo "================ dqkv=$v"
  ZEST_TIMELINE_RAW=/tmp/tl$v timeout 100 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 \
    --batch 1 --steps 30 --warmup 5 --timeline 1 --variant dqkv=$v 2>&1 | grep -vE '^sere_reroute alone' | tail -25
  python3 bench/timeline_raw.py /tmp/tl$v-b1.txt --phases moe_one_down_pair 2>&1 | tail -12
  python3 bench/timeline_raw.py /tmp/tl$v-b1.txt --phases decode_attention 2>&1 | tail -10
  [ "$v" = 0 ] && python3 bench/timeline_raw.py /tmp/tl$v-b1.txt 2>&1 | tail -12
  cp /tmp/tl$v-b1.txt "$OUT/" 2>/dev/null
done
