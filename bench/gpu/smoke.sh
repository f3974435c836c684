# limit: 420
# After a change that should not move results or speed (a refactor): the whole CUDA suite, then one decode figure at
# batch 1 and 8 and the whole-model prefill at 8k, to set against the last full check (bench/gpu-check.sh).
"$P/test_cuda" --gtest_brief=1 2>&1 | tail -4
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8 --context 1024 --steps 100 --warmup 10 2>&1 |
  grep -E 'copy bandwidth|^\| (1|8) '
"$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 2>&1 | grep -E '^\| (T|8192) '
