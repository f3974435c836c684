# limit: 75
# Decode experts at batch 1 (one token, 8 experts): every experts kernel in one process, with the compact routing
# (route=4): rows_mma (experts=1) at its occupancy variants (moe=0..3) and the streaming kernel's variants 0-13
# (experts=2..15), TPOT at batch 1 with and without SERE S=2.
V=""
for m in 1 0 2 3; do V="$V --variant route=4,experts=1,moe=$m"; done
for e in 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do V="$V --variant route=4,experts=$e"; done
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1 --context 1024 --steps 20 --warmup 3 \
  --sere-primary 2 --sere-threshold 0 $V 2>&1 | grep --line-buffered -E 'variant|copy|^\| [0-9]'
