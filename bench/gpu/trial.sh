# limit: 420
# The streaming experts' tail split (DecodeOption::kMoeTailSplit, `tail=`), alternating in one process; the kernel
# tests first.
timeout 150 "$P/test_cuda" --gtest_filter='CudaMoeStream.*:CudaMoeExperts.*:CudaMoePlan.*:CudaRoute.*:CudaDecoder.*:CudaSyntheticDecoder.*:CudaGraph.*' 2>&1 | grep -E "FAILED|PASSED|Failure|error" | head -20
timeout 260 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 8,32,64 --steps 40 --warmup 5 \
  --variant tail=1 --variant tail=0 --variant tail=1 --variant tail=0 2>&1 |
  grep -E "^== variant|TPOT|copy|bandwidth" | grep -v "^|"
