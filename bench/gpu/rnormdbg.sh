# limit: 150
for d in 0 8 32 64; do
  echo "== ZEST_RNORM_DEBUG=$d"
  ZEST_RNORM_DEBUG=$d timeout 25 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 30 --warmup 5 \
    --variant rnorm=1 --variant rnorm=0 --variant rnorm=1,experts=1 --variant rnorm=0,experts=1 2>&1 | grep -E "variant|batch 1:|batch 8:"
done
