# limit: 75
# Streaming decode experts with multiprocessors left free (DecodeOption::kStreamReserve, bench variant reserve=N), so
# that the combine + RMSNorm kernel after them is resident when they end: the streaming tests (reserve 100 included,
# bit for bit), then TPOT at batch 8/16/32/64 with 0, 4, 8 and 16 multiprocessors reserved and the step's per-op costs
# at batch 8 for 0 and 8.
timeout 25 "$P/test_cuda" --gtest_filter='CudaMoeStream.BatchOne*:CudaMoeStream.ModelWidths*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
F='^    (moe experts|moe combine|qkv gemm|decode attention \(fused\))|variant|^\| [0-9]|copy'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 8,16,32,64 --context 1024 --steps 30 --warmup 5 \
  --ablate 8 --ablate-steps 8 --variant reserve=0 --variant reserve=8 2>&1 | grep --line-buffered -E "$F"
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 8,16,32,64 --context 1024 --steps 30 --warmup 5 \
  --variant reserve=4 --variant reserve=16 --variant reserve=0 2>&1 | grep --line-buffered -E "$F"
