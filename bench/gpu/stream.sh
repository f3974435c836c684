# limit: 75
# Streaming decode experts (moe_stream.cu) with items claimed in order: the streaming tests (two plans on two streams
# at once, a launch beside a kernel holding all but two multiprocessors), the decode-graph tests with the streaming
# kernel as the default by batch; TPOT at batch 1/8/32/64 (SERE off and S=2) for experts=0 (the default by batch:
# rows_mma at one token, experts=13 up to 8 tokens, experts=14 above) against experts=1 (rows_mma); then batch
# 1/8/32/64 without SERE for the streaming variants: experts=13 / 14 = variants 11 / 12 (the defaults), experts=16..19
# = variants 14-17 (each consumer warp owns whole m16 tiles: no shared partial sums, no epilogue warp). Output is
# line-buffered so that a cut run still reports. The default run also times the step without each op at batch 8
# (the experts' cost per layer).
timeout 35 "$P/test_cuda" --gtest_filter='CudaMoeStream*:CudaGraph*:CudaMoeExperts.Decode*:CudaMoePlan*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
F='^    (qkv|qk norm|o gemm|add|router|lm_head|moe plan|moe combine|decode attention|ablation)|^sere_reroute'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 30 --warmup 5 --ablate 8 --ablate-steps 8 --variant experts=0 --variant experts=1 2>&1 |
  grep --line-buffered -vE "$F"
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --steps 20 --warmup 3 \
  --variant experts=13 --variant experts=14 --variant experts=16 --variant experts=17 --variant experts=18 \
  --variant experts=19 2>&1 | grep --line-buffered -E 'variant|batch [0-9]+:|^\| [0-9]'
