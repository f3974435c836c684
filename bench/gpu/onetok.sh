# limit: 75
# Decode experts at one token (moe_one.cu, DecodeOption::kMoeKernel 16-17, the default at one token 17): the tests
# (bit-identical to rows_mma and within tolerance of the host reference; model and odd shapes, SERE-like two experts,
# graph replay with programmatic launches and new routings; phase times of both variants and graph replay times of
# plan + experts printed), then batch-1 TPOT (SERE off and S=2) for experts=0 (the default: moe_one variant 1; per-op
# ablation at batch 1) against experts=1 (rows_mma, the previous default) and experts=16 (variant 0), then the check
# table at batch 1/8/32/64 with the defaults. Output is line-buffered so that a cut run still reports.
timeout 30 "$P/test_cuda" --gtest_filter='CudaMoeOne*:CudaMoeExperts.Decode*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
F='^    (qkv|qk norm|o gemm|router gemm|router top-k|lm_head|moe plan|decode attention  )|^sere_reroute'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 30 --warmup 5 --ablate 1 --ablate-steps 8 --variant experts=0 --variant experts=1 --variant experts=16 \
  2>&1 | grep --line-buffered -vE "$F" | grep --line-buffered -vE '^\| batch|^\|---'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 20 --warmup 3 2>&1 | grep --line-buffered -E '^\| [0-9]|^SERE|bandwidth'
