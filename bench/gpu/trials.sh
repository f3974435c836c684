# limit: 300
# Decode forms under measurement (DecodeOption::kTrial bits, kMoeCombine 2): the kernel tests that cover them (bit for
# bit against the default forms / host references), then TPOT at batch 1 and 8, every form alternating in one process.
# trial bit 0: the fused decode attention's q / k / v loads issued at once; bit 1: the one-token down items' next loads
# issued before the reduction; bit 2: the ring attention's later pages prefetched into L2 before the wait;
# combine=2: the one-token folded combine over bf16 slot rows.
timeout 120 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeOne*:CudaDecodeAttention*:CudaGraph*:CudaDecoder*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 170 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant combine=1 --variant combine=2 --variant trial=1 --variant trial=2 --variant trial=4 \
  --variant combine=2,trial=7 \
  --variant combine=2,trial=7 --variant trial=4 --variant trial=2 --variant trial=1 --variant combine=2 \
  --variant combine=1 2>&1 | grep -vE '^sere_reroute alone'
