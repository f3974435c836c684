# limit: 200
# Where the decode attention's time goes (timeline package: TIMELINE=1 bench/gpu-package.sh): the per-CTA records of
# one replayed step at batch 1 and 8 (bench/gpu/timeline_raw.sh), then each attention launch's phase stamps (min /
# median / max over its CTAs, us after its release; medians over the layers) and the small-M GEMMs' residency.
export TL_PREFIX=tl
bash bench/gpu/timeline_raw.sh
for b in 1 8; do
  echo "== batch $b: decode attention phases"
  python3 bench/timeline_raw.py "$OUT/tl-b$b.txt" --phases decode_attention_fused
  echo "== batch $b: o / qkv GEMM residency"
  python3 bench/timeline_raw.py "$OUT/tl-b$b.txt"
done
