# limit: 220
# The MoE combine folded into the next layer's qkv GEMM (combine=2: gemm_combine, the combine + RMSNorm inside
# clusters of the GEMM's CTAs) against the default (combine=1: the combine in the one-token experts' down kernel at
# batch 1, its own launch above): the tests of the fold (bit for bit against the separate launches, decoders and
# graphs), then TPOT at batch 1-8 alternating the two in one process (Qwen3-30B-A3B shapes, context 1024).
timeout 100 "$P/test_cuda" --gtest_brief=1 \
  --gtest_filter='CudaLatencyGemm.Combine*:CudaLatencyDecoder.Combine*:CudaGraph.FoldedCombine*:CudaLatencyNorm*:CudaMoeOne.Folded*:CudaLatencyGemm.KvPrefetch*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 110 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,4,8 --steps 60 --warmup 10 \
  --sere-primary 2 --sere-threshold 0 \
  --variant combine=1 --variant combine=2 --variant combine=1 --variant combine=2 2>&1 |
  grep -vE '^sere_reroute alone'
