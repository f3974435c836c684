# limit: 300
# The one-token experts' gate/up and down-pair kernels at most 64 registers (DecodeOption::kMoeDownRows 3, with the
# gate/up carveout leaving room for a pair CTA as 2 does), so that a pair CTA fits beside three gate/up CTAs and its
# weight copies start before they leave; against 1 (default) and 2 (the carveout alone), on top of the slim qkv GEMM
# with the compact attention (slim=2, attn=11): the tests, then TPOT at batch 1 (SERE S=2 too) alternating.
"$P/test_cuda" --gtest_filter='CudaMoeOne.*' 2>&1 | grep -E "PASSED|FAILED|Failure|error" | head -12
B=attn=11,slim=2
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant $B --variant $B,rows=3 --variant $B,rows=2 --variant "" --variant $B,rows=3 --variant $B \
  --variant $B,rows=3 --variant "" --variant $B --variant $B,rows=3 2>&1 | grep -E "bandwidth|== variant|  batch"
