# limit: 240
# Timeline package (TIMELINE=1 bench/gpu-package.sh, carried as .gpu/zest-timeline.tar.xz and passed as ZEST_PKG):
# batch 1, when the qkv GEMM's weight tiles land by when its CTAs became resident, with the default L2 hints
# (kL2Prefetch 0: the KV prefetch, evict-first tiles and expert weights) and without any (kL2Prefetch 4,
# kMoeEvictFirst 0), to see which concurrent stream of the down phase holds the tile copies.
for v in "l2=0" "l2=4,ef=0"; do
  tag=$(echo "$v" | tr ',=' '__')
  ZEST_TIMELINE_RAW=${OUT:-/tmp}/qkv_$tag timeout 90 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 \
    --batch 1 --steps 30 --warmup 5 --timeline 1 --variant "$v" 2>&1 | grep "variant:\|^    |\|layer:"
  python3 bench/timeline_raw.py "${OUT:-/tmp}/qkv_$tag-b1.txt" --landing rows_pre 320
done
