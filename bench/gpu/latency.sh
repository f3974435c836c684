# limit: 75
# Low-latency decode kernels (batch 1-16) at Qwen3-30B-A3B shapes on one H200: their tests (and the decoder tests,
# which run the new default GEMM), then TPOT at batch 1, 8 and 64 (SERE off and S=2) for the decode variants against
# the previous defaults (gemm=1,route=0), the per-op ablation at batch 1 of the first variant and its eager per-op
# times. Defaults: gemm=4 (weight tile bulk-copied into shared memory before the PDL wait), route=1 (router GEMM +
# top-k + plan in one cluster launch). route=2: with the residual add + RMSNorm folded in; attn=2: decode attention
# with q/k norm + RoPE + KV write folded in; attn=3: as 2 with the splits merged inside a cluster.
timeout 22 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaLatency*:CudaGemm*:CudaNorm*:CudaRouter*:CudaMoePlan*:CudaDecodeAttention*:CudaSyntheticDecoder*:CudaDecoder*'
B="$P/bench_decode_bench --config qwen3-30b-a3b --context 1024 --sere-primary 2 --sere-threshold 0 --steps 60 --warmup 5"
timeout 20 $B --batch 1 --ablate 1 --ablate-steps 10 --profile --variant attn=3,route=2
timeout 32 $B --batch 1,8,64 --variant attn=3,route=2 --variant attn=3,route=1 --variant attn=2,route=2 --variant gemm=1,route=0
