# limit: 240
# The MoE combine folded into the next layer's qkv GEMM (gemm_combine; combine=2: the combine + RMSNorm inside
# clusters of the GEMM's CTAs; 4: whole rows in every CTA for 1-2 tokens; 3: both) against the default (combine=1: the
# combine in the one-token experts' down kernel at batch 1, its own launch above): the tests of the fold (bit for bit
# against the separate launches, decoders and graphs), then TPOT alternating the forms in one process (Qwen3-30B-A3B
# shapes, context 1024).
timeout 120 "$P/test_cuda" --gtest_brief=1 \
  --gtest_filter='CudaLatencyGemm.Combine*:CudaLatencyDecoder.Combine*:CudaGraph.FoldedCombine*:CudaLatencyNorm*:CudaMoeOne.Folded*:CudaLatencyGemm.KvPrefetch*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 110 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2 --steps 60 --warmup 10 \
  --sere-primary 2 --sere-threshold 0 \
  --variant combine=1 --variant combine=4 --variant combine=1 --variant combine=4 --variant combine=2 2>&1 |
  grep -E '^== |TPOT'
