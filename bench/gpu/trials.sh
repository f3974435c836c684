# limit: 300
# Decode forms under measurement (DecodeOption::kTrial bits): the kernel tests that cover them (bit for bit against
# the default forms / host references), then TPOT at batch 1 and 8, the forms alternating in one process.
# bit 7: the small-M GEMMs' weight tiles (qkv, o) copied into shared memory by cp.async from every thread instead of
# one thread's bulk copies (TMA); bit 4 (16): the separate combine split over 4-CTA clusters.
timeout 150 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaLatencyGemm*:CudaGraph*:CudaDecoder*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 140 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant trial=0 --variant trial=128 --variant trial=144 --variant trial=128 --variant trial=0 \
  --variant trial=144 --variant trial=128 --variant trial=0 \
  2>&1 | grep -vE '^sere_reroute alone'
