# limit: 420
# TEMPORARY: the streaming experts' end and first claims (DecodeOption::kMoeStreamTrial), alternating in one process.
timeout 120 "$P/test_cuda" --gtest_filter='CudaMoeStream.*:CudaMoeExperts.*:CudaMoePlan.*:CudaRoute.*:CudaDecoder.*:CudaSyntheticDecoder.*:CudaGraph.*' 2>&1 | tail -5
timeout 290 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 8,32,64 --steps 40 --warmup 5 \
  --variant trial=0 --variant trial=1 --variant trial=2 --variant trial=2 --variant trial=1 --variant trial=0 2>&1 |
  grep -E "^== variant|TPOT|copy|bandwidth" | grep -v "^|"
