# limit: 150
# The MoE combine folded into the next layer's qkv GEMM at one token (DecodeOption::kFoldCombine; Qwen3-30B-A3B
# shapes, context 1024, one H200): its tests (kernel against the chain bit for bit, synthetic and CUDA decoders'
# tokens with the option on and off), then TPOT at batch 1 and 8 with fold=0 and fold=1 (batch 8 does not fold: a
# control), twice, with the per-op ablation at batch 1 for fold=1.
timeout 60 "$P/test_cuda" --gtest_brief=1 \
  --gtest_filter='CudaLatencyNorm*:CudaSyntheticDecoder.DecodeVariants*:CudaDecoder.Folded*:Fixtures/CudaDecoderFixture*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 80 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 --ablate 1 --ablate-steps 8 \
  --variant fold=1 --variant fold=0 --variant fold=1 --variant fold=0 2>&1 | grep -vE '^sere_reroute alone'
