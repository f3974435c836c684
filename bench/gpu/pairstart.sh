# limit: 200
# The one-token down pair kernel's cluster start barrier (rank 1 stores into rank 0's shared memory only once rank 0
# is known to run; compute-sanitizer racecheck reported 64512 stores into "a block that might not have entered yet"
# without it): its tests, then racecheck of the test that runs the pair kernel alone, then batch-1 TPOT.
set -u
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaDecoder.DownRows*' 2>&1 | grep -E '^\[  (PASSED|FAILED)|Failure' | head -8
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 20 \
  "$P/test_cuda" --gtest_filter='CudaMoeOne.DownPairWithStartBarrierMatchesTheChain' 2>&1 |
  grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)|Potential' | sort | uniq -c | head -6
timeout 60 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 2>&1 | grep -E '^\| 1 '
