# limit: 150
# combine=2 (the MoE combine in the next qkv GEMM) against combine=1, with the one-token experts' carveout preference
# (carve=1, default) and the driver's (carve=0), batch 1 and 8 (Qwen3-30B-A3B shapes, context 1024).
timeout 140 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 60 --warmup 10 \
  --variant combine=1 --variant combine=2 --variant combine=2,carve=0 --variant combine=1,carve=0 \
  --variant combine=1 --variant combine=2 --variant combine=2,carve=0 2>&1 | grep -E '^== |TPOT'
