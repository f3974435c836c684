# limit: 150
for c in 0 1 2 3 7; do
  echo "== ZEST_MAXCARVE=$c"
  ZEST_MAXCARVE=$c timeout 25 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 30 --warmup 5 \
    --variant carve=1 --variant carve=0 2>&1 | grep -E "variant|batch 1:|batch 8:"
done
