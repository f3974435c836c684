# limit: 300
# Batch 1: the one-token gate/up weights bulk-copied into shared-memory stages (DecodeOption::kMoeGateUpBulk 1)
# against the register loads (0, default): the tests (bit for bit against rows_mma and the chain), then TPOT
# alternating in one process (batch 8 runs the streaming experts: a control).
"$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeOne.*:CudaDecoder.DownRows*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]' | tail -25
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 --variant gub=0 --variant gub=1 --variant gub=1 --variant gub=0 --variant gub=0 \
  --variant gub=1 --variant gub=1 --variant gub=0 2>&1 | grep "variant:\|^| [0-9]\|rror"
