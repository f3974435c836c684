# limit: 420
# The cluster decode attention with compact V buffers (kAttentionKernel 10: 20 KB instead of 32, so a CTA fits beside
# three qkv GEMM tiles and its cluster can be resident before they leave) against the default (8): the fused variants'
# tests, then TPOT at batch 1 (the form applies up to 8 kv-head pairs with at most 5 pages per split) alternating in
# one process, batch 8 as a control.
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.Fused*' 2>&1 | grep -E "PASSED|FAILED|Failure|error" | head -12
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 60 --warmup 5 \
  --variant attn=8 --variant attn=10 --variant attn=10 --variant attn=8 --variant attn=8 --variant attn=10 \
  --variant attn=10 --variant attn=8 2>&1 | grep -E "bandwidth|== variant|  batch"
