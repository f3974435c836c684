# limit: 200
# TRIAL (DecodeOption::kNextWeights): the o GEMM's CTAs prefetch the next layer's qkv weights into L2 as they finish
# (nextw=1 normal priority, 2 evict-last; 3 / 4 the same with the one-token experts' weight loads evict-first; 5 those
# loads only) against the default (nextw=0), alternating in one process, batch 1 and 8.
timeout 190 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant nextw=0 --variant nextw=1 --variant nextw=2 --variant nextw=3 --variant nextw=4 --variant nextw=5 \
  --variant nextw=5 --variant nextw=4 --variant nextw=3 --variant nextw=2 --variant nextw=1 --variant nextw=0 2>&1 |
  grep -E "^== variant|^  batch"
