# limit: 75
# L2 prefetch of the next layer's qkv and o weights during routing (DecodeOption::kL2Prefetch, --variant prefetch=N)
# and decode routing variants, against the defaults in the same run: the norm tests (bit identity with prefetch),
# then TPOT at batch 1/8/32/64 (SERE off) with the per-op ablation at batch 1 and 8 for prefetch=1.
timeout 20 "$P/test_cuda" --gtest_filter='CudaNorm*' 2>&1 | grep -E 'OK|FAILED|PASSED|Failure' | head -12
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --steps 30 --warmup 5 \
  --variant prefetch=0 --variant prefetch=1 --variant prefetch=2 --variant route=0 2>&1 |
  grep --line-buffered -E '^(== variant|\| [0-9])'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8 --context 1024 --steps 20 --warmup 3 --ablate 1,8 \
  --ablate-steps 8 --variant prefetch=1 2>&1 | grep --line-buffered -E 'variant|batch|qkv|o gemm|router|experts|attention'
