# limit: 400
# The one-token down kernel by rows with its CTAs prefetching the next layer's qkv weights into L2 after their wait
# (DecodeOption::kMoeDownRows 3) against the kept form (1): the tests (x bit for bit), then batch 1 TPOT (SERE off and
# S=2) alternating in one process.
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaDecoder.DownRows*:CudaGraph*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -30
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant rows=1 --variant rows=3 --variant rows=3 --variant rows=1 --variant rows=1 --variant rows=3 \
  --variant rows=3 --variant rows=1 2>&1 | grep "variant:\|^| [0-9]\|error"
