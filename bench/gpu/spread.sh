# limit: 200
# The process-to-process spread of the decode figures with the default kernels: five processes in a row, each
# `bench_decode_bench --batch 1,8 --steps 100 --warmup 10` (its own weights, allocations and graphs), the copy
# bandwidth and the batch-1 / batch-8 rows of each.
for i in 1 2 3 4 5; do
  echo "== process $i"
  "$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8 --context 1024 --steps 100 --warmup 10 2>&1 |
    grep -E 'copy bandwidth|^\| (1|8) '
done
