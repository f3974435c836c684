# limit: 75
# Streaming decode experts (moe_stream.cu) with items claimed in order: the streaming tests (two plans on two streams
# at once, a launch beside a kernel holding all but two multiprocessors), the decode-graph tests with the streaming
# kernel as the default by batch, then TPOT at batch 1/8/32/64 (SERE off and S=2): experts=0 = the default by batch
# (rows_mma at one token, experts=4 up to 8 tokens, experts=9 above), experts=1 = rows_mma, experts=4 / experts=9 =
# streaming variants 2 / 7. Output is line-buffered so that a cut run still reports.
timeout 35 "$P/test_cuda" --gtest_filter='CudaMoeStream*:CudaGraph*:CudaMoeExperts.Decode*:CudaMoePlan*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 30 --warmup 5 --variant experts=0 --variant experts=1 --variant experts=4 --variant experts=9 2>&1 |
  grep --line-buffered -vE '^    (qkv|qk norm|o gemm|add|router|lm_head|moe plan|moe combine|decode attention|ablation)|^sere_reroute'
