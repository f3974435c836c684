# limit: 200
# Batch 1: the one-token experts' weight loads marked evict-first in L2 (DecodeOption::kMoeEvictFirst 1) against the
# default: the tests (x bit for bit), then TPOT alternating in one process.
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaDecoder.DownRows*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -20
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 --variant ef=0 --variant ef=1 --variant ef=1 --variant ef=0 --variant ef=0 \
  --variant ef=1 --variant ef=1 --variant ef=0 2>&1 | grep "variant:\|^| [0-9]\|error"
