# limit: 120
# The session's decode changes against their previous forms in one process (Qwen3-30B-A3B shapes, context 1024, one
# H200): the MoE combine folded into the one-token experts' down kernel (combine=1, default) or launched apart
# (combine=0), and the one-token experts' carveout preference (carve=1, default: the smallest that holds their CTAs;
# carve=0: the driver's).
timeout 110 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,32,64 --steps 60 --warmup 10 \
  --sere-primary 2 --sere-threshold 0 \
  --variant combine=1 --variant combine=0 --variant combine=1,carve=0 --variant combine=1 --variant combine=0 2>&1 |
  grep -vE '^sere_reroute alone'
