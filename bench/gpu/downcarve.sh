# limit: 150
# Batch 1: the one-token experts' down kernel asking for a larger shared-memory carveout (carve=1xx: xx percent; the
# gate/up kernel keeps the smallest), so that the next layer's qkv GEMM CTAs (66 KB of tile each) can move onto an SM
# as its down CTAs leave instead of after it drains; carve=1 = the smallest for both (default). One process.
timeout 140 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant carve=1 --variant carve=158 --variant carve=172 --variant carve=186 --variant carve=200 \
  --variant carve=1 --variant carve=158 --variant carve=172 --variant carve=186 --variant carve=200 2>&1 |
  grep -E "^== |TPOT [0-9]"
