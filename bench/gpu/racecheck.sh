# limit: 560
# compute-sanitizer racecheck over the tests of the clustered decode kernels (distributed shared memory, cluster
# barriers): the fused routing kernels against the separate launches, the one-token experts with the down
# projection by rows in CTA pairs (FoldedCombineMatchesTheSeparateLaunch), the clustered argmax, sampling
# (SampleRows.*: 140 s under the sanitizer), decode attention with the cluster merge and the bulk-copy ring
# (FusedRefillsTheRingStages, contexts where the ring's stages are refilled), and
# the lm_head's bulk-copy ring refilling its stages (RingRefillsItsStagesWithShortRows). Per test group: the summary, the kinds of report (addresses,
# threads and blocks folded) and the source lines named, most frequent first; the first 120 lines of each log go to
# $OUT/racecheck-<group>.txt. Env FILTERS (space-separated gtest filters) and EACH (seconds per group) override.
set -u
FILTERS=${FILTERS:-"CudaRoute.MatchesSeparateLaunchesBitForBit CudaMoeOne.FoldedCombineMatchesTheSeparateLaunch CudaMoeOne.DownPairWithStartBarrierMatchesTheChain CudaArgmax.FindsMaximumWithLowestIndexOnTies SampleRows.* CudaDecodeAttention.FusedRefillsTheRingStages CudaLatencyGemm.RingRefillsItsStagesWithShortRows"}
for f in $FILTERS; do
  tag=$(echo "$f" | tr -c 'A-Za-z0-9' _ | cut -c1-60)
  log=/tmp/racecheck-$tag.log
  start=$(date +%s)
  timeout "${EACH:-180}" /usr/local/cuda/bin/compute-sanitizer --tool racecheck --racecheck-report hazard \
    --print-limit 200 "$P/test_cuda" --gtest_filter="$f" >"$log" 2>&1
  rc=$?
  echo "== $f: rc=$rc $(($(date +%s) - start)) s"
  grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED)" "$log" | head -4
  grep -E "^========= +(Potential|Error|Warning)" "$log" |
    sed -E 's/0x[0-9a-f]+/ADDR/g; s/\([0-9, ]+\)/(.)/g' | sort | uniq -c | sort -rn | head -4
  grep -oE "[A-Za-z_0-9]+\.(cu|cuh):[0-9]+" "$log" | sort | uniq -c | sort -rn | head -6
  [ -n "${OUT:-}" ] && head -120 "$log" >"$OUT/racecheck-$tag.txt"
done
