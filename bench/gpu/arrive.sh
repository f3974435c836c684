# limit: 560
# The bulk-copy rings' stages handed back with one arrival per reading thread (rows_ring, the ring decode attention,
# the streaming experts; before: lane 0 of each reading warp after __syncwarp). Part 1 (RACE unset): the whole CUDA
# suite, then decode TPOT of this package against the one before it (packed in as old/: OLD_ZEST), alternating.
# Part 2 (RACE=1): compute-sanitizer racecheck and memcheck of the small tests that refill every ring's stages.
set -u
if [ -z "${RACE:-}" ]; then
  "$P/test_cuda" 2>&1 | grep -E '^\[  (PASSED|FAILED)|^\[==========\]|Failure' | head -12
  ROUNDS=2 bash bench/gpu-ab.sh "$P" \
    '"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,32 --steps 60 --warmup 5 --sere-primary 2 --sere-threshold 0' |
    grep -E '^\S+ r[0-9]+: \| [0-9]+ |copy bandwidth'
  exit 0
fi
for f in CudaLatencyGemm.RingRefillsItsStagesWithShortRows CudaMoeStream.OddWidthsMultipleOf64 \
  CudaDecodeAttention.FusedVariantsRefillTheRingStages; do
  start=$(date +%s)
  timeout "${EACH:-120}" /usr/local/cuda/bin/compute-sanitizer --tool racecheck --racecheck-report hazard \
    --print-limit 50 "$P/test_cuda" --gtest_filter="$f" >/tmp/rc.log 2>&1
  echo "== racecheck $f: rc=$? $(($(date +%s) - start)) s"
  grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED)" /tmp/rc.log | head -3
  grep -oE "[A-Za-z_0-9]+\.(cu|cuh):[0-9]+" /tmp/rc.log | sort | uniq -c | sort -rn | head -4
  [ -n "${OUT:-}" ] && head -60 /tmp/rc.log >"$OUT/racecheck-${f##*.}.txt"
done
start=$(date +%s)
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck "$P/test_cuda" \
  --gtest_filter='CudaLatencyGemm.Ring*:CudaMoeStream.*:CudaDecodeAttention.FusedVariantsRefillTheRingStages' 2>&1 |
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" | head -3
echo "== memcheck: $(($(date +%s) - start)) s"
