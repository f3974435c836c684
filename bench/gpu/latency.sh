# limit: 75
# Low-latency decode kernels (batch 1-16) at Qwen3-30B-A3B shapes on one H200: their tests, then TPOT at batch 1, 8
# and 64 (SERE off and S=2) for the new decode variants against the defaults (gemm=1), with the per-op ablation at
# batch 1 of each run's first variant. route=1: fused routing (router GEMM + top-k + plan, one cluster launch);
# gemm=4: small-M GEMM with the weight tile bulk-copied into shared memory before the PDL wait; attn=2: decode
# attention with q/k norm + RoPE + KV write folded in (KV pages loaded before the PDL wait).
timeout 25 "$P/test_cuda" --gtest_filter='CudaLatency*:CudaGemmSmallM*:CudaRouter*:CudaMoePlan*:CudaDecodeAttention*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
B="$P/bench_decode_bench --config qwen3-30b-a3b --batch 1,8,64 --context 1024 --sere-primary 2 --sere-threshold 0 --steps 60 --warmup 5 --ablate 1 --ablate-steps 10"
timeout 26 $B --variant route=1,gemm=4 --variant gemm=1 --variant route=1 --variant gemm=4
timeout 20 $B --variant attn=2,route=1,gemm=4 --variant attn=2
