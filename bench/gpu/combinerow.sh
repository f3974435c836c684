# limit: 120
# One combine row function for the separate combine launch and the one-token experts' folded combine
# (combine_norm_row): the tests of both (bit for bit against each other and the host reference) and of the decoders
# and graphs that run them, then TPOT at batch 1 and 8 with the default kernels.
timeout 80 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaNorm*:CudaLatencyNorm*:CudaMoeOne*:CudaMoeBlock*:CudaGraph*:CudaDecoder*:CudaSynthetic*:CudaMoeStream*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 30 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 2>&1 | grep -vE '^sere_reroute alone'
