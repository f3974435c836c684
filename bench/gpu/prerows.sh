# limit: 150
# The qkv GEMM's weight tile split around the PDL wait (DecodeOption::kQkvPreRows; Qwen3-30B-A3B shapes, context 1024,
# one H200): its test (every split against gemm(), bit for bit), then TPOT at batch 1, 8 and 32 with 16 (default, all
# rows before the wait), 12, 8, 4 and 1 rows before the wait, and the default again.
timeout 40 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaLatencyGemm.KvPrefetch*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
timeout 100 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8,32 --steps 30 --warmup 5 \
  --variant pre=0 --variant pre=12 --variant pre=8 --variant pre=4 --variant pre=1 --variant pre=0 2>&1 |
  grep -E '^== variant|^  batch'
