# limit: 400
# The one-token down kernel by output rows with the norm folded into the next qkv GEMM (DecodeOption::kMoeDownRows):
# its tests and the decoder / graph tests, then batch-1 TPOT with it (rows=1) against the folded combine (rows=0),
# alternating in one process.
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaLatencyGemm.*:CudaDecoder*:CudaGraph*' 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | tail -25
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 --sere-primary 2 \
  --sere-threshold 0 --variant rows=0 --variant rows=1 --variant rows=0 --variant rows=1 2>&1 | grep -v "^sere_reroute"
