# limit: 560
# compute-sanitizer racecheck over the tests of the clustered decode kernels (distributed shared memory, cluster
# barriers): decode attention with the cluster merge and the bulk-copy ring (FusedVariantsMatchReference: every fused
# variant), the compact routing kernel against the cluster routing kernel, the one-token experts with the down
# projection by rows in CTA pairs, sampling and the clustered argmax. One line per test group: hazards reported
# (errors / warnings) and the kernels named in them. Env FILTERS (space-separated gtest filters) overrides the list.
set -u
FILTERS=${FILTERS:-"CudaArgmax.* CudaRoute.CompactKernelMatchesClusterKernelBitForBit CudaMoeOne.ModelShapeOneToken:CudaMoeOne.FoldedCombineMatchesTheSeparateLaunch CudaDecodeAttention.FusedVariantsMatchReference"}
for f in $FILTERS; do
  log=/tmp/racecheck-$(echo "$f" | tr -c 'A-Za-z0-9' _).log
  start=$(date +%s)
  timeout ${EACH:-150} /usr/local/cuda/bin/compute-sanitizer --tool racecheck --racecheck-report hazard \
    "$P/test_cuda" --gtest_filter="$f" >"$log" 2>&1
  rc=$?
  echo "== $f: rc=$rc $(($(date +%s) - start)) s"
  grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$log" | head -4
  grep -oE "(Error|Warning): Race reported between .*" "$log" | head -3
  grep -oE "in [A-Za-z_0-9:<>, ]+\(" "$log" | sort | uniq -c | sort -rn | head -6
done
