# limit: 75
# Low-latency decode kernels (batch 1-16) at Qwen3-30B-A3B shapes on one H200: their tests, then TPOT at batch 1, 8
# and 64 (SERE off and S=2) for the new decode variants against the defaults (gemm=1), with the per-op ablation at
# batch 1 of the first run's first variant. gemm=4: small-M GEMM with the weight tile bulk-copied into shared memory
# before the PDL wait; route=1: fused routing (router GEMM + top-k + plan, one cluster launch); route=2: the same with
# the residual add + RMSNorm folded in; attn=2: decode attention with q/k norm + RoPE + KV write folded in.
timeout 20 "$P/test_cuda" --gtest_filter='CudaLatency*:CudaGemmSmallM*:CudaRouter*:CudaMoePlan*:CudaDecodeAttention*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
B="$P/bench_decode_bench --config qwen3-30b-a3b --batch 1,8,64 --context 1024 --sere-primary 2 --sere-threshold 0 --steps 60 --warmup 5"
timeout 24 $B --ablate 1 --ablate-steps 10 --variant attn=2,route=2,gemm=4 --variant gemm=1
timeout 30 $B --variant attn=2,route=1,gemm=4 --variant gemm=4 --variant route=1 --variant route=2 --variant attn=2
