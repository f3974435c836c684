# limit: 60
# Streaming decode experts (moe_stream.cu), items claimed in order. The streaming tests (every variant; two plans on two
# streams at once; a launch beside a kernel that holds all but two multiprocessors); TPOT at batch 1/8/32/64 (SERE off
# and S=2) for experts=0 (the default by batch: rows_mma at one token, experts=13 up to 8 tokens, experts=14 above)
# against experts=1 (rows_mma), with the step timed without each op at batch 8 and 64 for the default (the experts'
# cost per layer); then batch 8/32/64 without SERE: experts=13 / 14 (variants 11 / 12, the defaults) against
# experts=4 / 9 (variants 2 / 7, the streaming pair before the epilogue warp and the items claimed ahead). Output is
# line-buffered so that a cut run still reports.
timeout 20 "$P/test_cuda" --gtest_filter='CudaMoeStream*' 2>&1 | grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
F='^    (qkv|qk norm|o gemm|add|router|lm_head|moe plan|moe combine|decode attention|ablation)|^sere_reroute'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 20 --warmup 3 --ablate 8,64 --ablate-steps 6 --variant experts=0 --variant experts=1 2>&1 |
  grep --line-buffered -vE "$F"
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 8,32,64 --context 1024 --steps 20 --warmup 3 \
  --variant experts=13 --variant experts=14 --variant experts=4 --variant experts=9 2>&1 |
  grep --line-buffered -E 'variant|batch [0-9]+:|^\| [0-9]'
