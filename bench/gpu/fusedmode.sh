# limit: 150
# TEMPORARY diagnostic of the fused one-token experts: graph replay time per (plan + experts + combine) with parts of
# the kernel switched off (ZEST_FUSED_MODE bits: 1 = no reductions, 2 = no down prefetch), the fused tests, then TPOT
# at batch 1 against the default, alternating.
timeout 30 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeOne.Fused*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
for m in 0 1 2 3 0; do
  echo "== mode $m"
  ZEST_FUSED_MODE=$m timeout 30 "$P/test_cuda" --gtest_filter='CudaMoeOne.FusedGraphReplayTimesPrinted' 2>&1 | grep -E "us per|CTAs|FAIL"
done
timeout 60 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 40 --warmup 5 \
  --variant experts=0 --variant experts=18 --variant experts=0 --variant experts=18 2>&1 | grep -E "^  batch"
