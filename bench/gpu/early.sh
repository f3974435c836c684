# limit: 75
# DecodeOption::kEarlyTrigger: the row-norm kernels (add + RMSNorm, combine + residual + RMSNorm) let the next kernel
# launch before they wait. Its test (same steps bit for bit), then TPOT at batch 1/8/32/64 with the option off and on
# in one process.
timeout 25 "$P/test_cuda" --gtest_filter='CudaGraph.EarlyTrigger*' 2>&1 | grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --steps 30 --warmup 5 \
  --variant early=0 --variant early=1 --variant early=0 2>&1 | grep --line-buffered -E 'variant|copy|^\| [0-9]'
