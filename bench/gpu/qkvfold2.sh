# limit: 150
# The MoE combine in the next qkv GEMM (combine=2: clusters; 4: whole rows per CTA) against combine=1 (in the
# one-token experts' down kernel), with the down kernel's carveout holding one / two qkv CTAs beside its own
# (carve=2 / 3) so that the qkv CTAs can become resident while down CTAs still run; batch 1 and 2 (Qwen3-30B-A3B
# shapes, context 1024).
timeout 140 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2 --steps 60 --warmup 10 \
  --variant combine=1 --variant combine=2,carve=2 --variant combine=4,carve=2 --variant combine=2,carve=3 \
  --variant combine=4,carve=3 --variant combine=1,carve=2 --variant combine=1 --variant combine=2,carve=2 \
  --variant combine=4,carve=3 2>&1 | grep -E '^== |TPOT'
