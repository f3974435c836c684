# limit: 300
# Decode forms under measurement (DecodeOption::kTrial bits): the kernel tests that cover them (bit for bit against
# the default forms / host references), then TPOT at batch 1 and 8, the forms alternating in one process.
# bit 5: the o GEMM (K = 4096) in two rounds of 8 chunks per warp (62 registers, so its CTA fits beside two CTAs of
# the fused decode attention); bit 6: the cluster fused decode attention at 128 registers (beside three).
timeout 150 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaLatencyGemm*:CudaDecodeAttention*:CudaGraph*:CudaDecoder*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 140 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant trial=0 --variant trial=32 --variant trial=96 --variant trial=64 \
  --variant trial=64 --variant trial=96 --variant trial=32 --variant trial=0 \
  2>&1 | grep -vE '^sere_reroute alone'
