# limit: 120
# TEMPORARY diagnostic of the fused one-token experts: graph replay time per (plan + experts + combine) with parts of
# the kernel switched off (ZEST_FUSED_MODE bits: 1 = no reductions, 2 = no down copies, 4 = contiguous down copies).
for m in 0 1 2 3 4 5 0; do
  echo "== mode $m"
  ZEST_FUSED_MODE=$m timeout 30 "$P/test_cuda" --gtest_filter='CudaMoeOne.FusedGraphReplayTimesPrinted' 2>&1 | grep -E "us per|CTAs|FAIL"
done
