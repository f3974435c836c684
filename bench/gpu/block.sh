# limit: 60
# The MoE half of a decode layer in one cooperative launch (moe_block.cu, DecodeOption::kMoeBlock): its tests against
# the chain of kernels (T = 1, 3, 8; model and odd shapes; repeat, two streams, graph replay with programmatic
# launches, decoder steps; CTA 0's phase times printed), then decode TPOT at batch 1/2/4/8: block=1 (gate/up weights
# through a bulk-copy ring; per-op ablation at batch 1) against block=0 (the chain) and block=3 (register loads).
# Output is line-buffered so that a cut run still reports.
timeout 20 "$P/test_cuda" --gtest_filter='*CudaMoeBlock*' 2>&1 | grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
F='^    (qkv|qk norm|o gemm|router gemm|router top-k|lm_head|moe plan|decode attention  )|^sere_reroute|^SERE'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,2,4,8 --context 1024 --steps 30 --warmup 5 --ablate 1 \
  --ablate-steps 8 --variant block=1 --variant block=0 --variant block=3 2>&1 | grep --line-buffered -vE "$F"
