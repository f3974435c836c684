# limit: 300
# Decode forms under measurement (DecodeOption::kTrial bits): the kernel tests that cover them (bit for bit against
# the default forms / host references), then TPOT at batch 1, 8 and 32, the forms alternating (ABBA) in one process.
# trial bit 4: the separate MoE combine + RMSNorm (batch 2 and up) with each row split over a 4-CTA cluster.
timeout 120 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaLatencyNorm*:CudaNorm*:CudaMoeOne*:CudaGraph*:CudaDecoder*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 170 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,32,64 --steps 40 --warmup 5 \
  --variant trial=0 --variant trial=16 --variant trial=16 --variant trial=0 --variant trial=0 --variant trial=16 \
  2>&1 | grep -vE '^sere_reroute alone'
