# limit: 300
# The one-token down pair kernel with its cluster start barrier (DecodeOption::kMoeDownRows 3): racecheck reported
# 64512 stores into "a block that might not have entered yet" without it (BENCHMARKS, served decode steps section).
# Its tests, racecheck of the test that runs only the barrier form, then batch-1 TPOT with and without it, ABBA.
set -u
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaDecoder.DownRows*' 2>&1 | grep -E '^\[  (PASSED|FAILED)|Failure' | head -8
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 20 \
  "$P/test_cuda" --gtest_filter='CudaMoeOne.DownPairWithStartBarrierMatchesTheChain' 2>&1 |
  grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)|Potential' | sort | uniq -c | head -6
timeout 150 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 --variant rows=1 --variant rows=3 --variant rows=3 --variant rows=1 \
  --variant rows=1 --variant rows=3 2>&1 | grep -E '^== variant|^\| 1 '
