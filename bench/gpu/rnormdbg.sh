# limit: 150
for c in 0 14 4; do
for d in 0 8; do
  echo "== ZEST_CARVEOUT_DBG=$c ZEST_RNORM_DEBUG=$d"
  ZEST_CARVEOUT_DBG=$c ZEST_RNORM_DEBUG=$d timeout 25 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 30 --warmup 5 \
    --variant rnorm=1 --variant rnorm=0 2>&1 | grep -E "variant|batch 1:|batch 8:"
done
done
