# limit: 75
# DecodeOption::kEarlyTrigger: 1 = the row-norm kernels (add + RMSNorm, combine + residual + RMSNorm) let the next
# kernel launch before they wait; 2 = as 1, and the captured graphs' programmatic edges fire at the upstream kernel's
# launch completion (graph_edges.h). Its test (same steps bit for bit), then TPOT at batch 1/8/32/64 with the option
# 0 / 1 / 2 in one process (0 twice: run-to-run spread).
timeout 25 "$P/test_cuda" --gtest_filter='CudaGraph.EarlyTrigger*' 2>&1 | grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --steps 30 --warmup 5 \
  --variant early=0 --variant early=1 --variant early=2 --variant early=0 2>&1 |
  grep --line-buffered -E 'variant|copy|^\| [0-9]'
