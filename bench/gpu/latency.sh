# limit: 60
# Low-latency decode kernels (batch 1-16) at Qwen3-30B-A3B shapes on one H200: their tests and the decoder tests,
# then TPOT at batch 1, 8 and 64 (SERE off and S=2): the defaults (gemm=4: small-M GEMM with the weight tile
# bulk-copied into shared memory before the PDL wait; route=1: router GEMM + top-k + plan in one 16-CTA cluster launch;
# attn=3: decode attention with q/k norm + RoPE + KV write folded in, splits merged in a cluster at small batch) with
# the per-op ablation at batch 1, then route=2 (clusters of 8 CTAs), route=3 (next kernel launched when the routing
# exits) and the previous defaults (gemm=1,route=0,attn=1).
timeout 20 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaLatency*:CudaGemm*:CudaNorm*:CudaRouter*:CudaMoePlan*:CudaDecodeAttention*:CudaSyntheticDecoder*:CudaDecoder*'
timeout 38 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --sere-primary 2 --sere-threshold 0 --steps 40 \
  --warmup 5 --batch 1,8,64 --ablate 1 --ablate-steps 8 --variant attn=3 --variant route=2 --variant route=3 \
  --variant gemm=1,route=0,attn=1
