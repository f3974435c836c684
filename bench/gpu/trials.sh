# limit: 300
# Decode forms under measurement (DecodeOption::kTrial bits): the kernel tests that cover them (bit for bit against
# the default forms / host references), then TPOT at batch 1, 8 and 32, the forms alternating (ABBA) in one process.
# trial bit 3: the experts (one-token and streaming) prefetch the next layer's qkv weights into L2 evict-last before
# their wait, the one-token experts' weights loaded evict-first.
timeout 120 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeOne*:CudaMoeStream*:CudaGraph*:CudaDecoder*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 170 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,32 --steps 40 --warmup 5 \
  --variant trial=0 --variant trial=8 --variant trial=8 --variant trial=0 --variant trial=0 --variant trial=8 \
  2>&1 | grep -vE '^sere_reroute alone'
