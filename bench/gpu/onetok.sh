# limit: 75
# Decode experts at one token (moe_one.cu, DecodeOption::kMoeKernel 16-32): the tests (bit-identical to rows_mma and
# within tolerance of the host reference; model and odd shapes, SERE-like two experts, graph replay with programmatic
# launches and new routings; phase times of each variant and graph replay times of plan + experts printed), then
# batch-1 TPOT (SERE off and S=2) for experts=30 (gate/up as rows_mma's with evict-first loads, prefetching the down
# weights into L2; down streaming them through registers; per-op ablation at batch 1) against experts=1 (rows_mma,
# the default at one token), 32 (rows_mma's kernels cloned), 31 (30 with the rest of each gate/up item prefetched),
# 25 (30 with the down tiles bulk-copied into shared memory after the wait), 18 (down tiles copied before the wait
# beside gate/up at 3 CTAs per SM), 16 (the same beside gate/up at 2 CTAs per SM).
# Output is line-buffered so that a cut run still reports.
timeout 30 "$P/test_cuda" --gtest_filter='CudaMoeOne*:CudaMoeExperts.Decode*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
F='^    (qkv|qk norm|o gemm|router gemm|router top-k|lm_head|moe plan|decode attention  )|^sere_reroute'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 20 --warmup 5 --ablate 1 --ablate-steps 8 --variant experts=30 --variant experts=1 --variant experts=32 \
  --variant experts=31 --variant experts=25 --variant experts=18 --variant experts=16 2>&1 | grep --line-buffered -vE "$F" |
  grep --line-buffered -vE '^\| batch|^\|---'
