# limit: 75
# Streaming decode experts (moe_stream.cu) with items claimed in order: the streaming tests (two plans on two streams
# at once, a launch beside a kernel holding all but two multiprocessors), the decode-graph tests with the streaming
# kernel as the default by batch; TPOT at batch 1/8/32/64 (SERE off and S=2) for experts=0 (the default by batch:
# rows_mma at one token, experts=4 up to 8 tokens, experts=9 above) against experts=1 (rows_mma); then batch 8/32/64
# without SERE for the streaming variants: experts=4 / 9 = variants 2 / 7 (the defaults), experts=10..15 = variants
# 8-13 (items claimed ahead, epilogue warp, four m16 tiles per stage). Output is line-buffered so that a cut run
# still reports.
timeout 35 "$P/test_cuda" --gtest_filter='CudaMoeStream*:CudaGraph*:CudaMoeExperts.Decode*:CudaMoePlan*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
F='^    (qkv|qk norm|o gemm|add|router|lm_head|moe plan|moe combine|decode attention|ablation)|^sere_reroute'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 30 --warmup 5 --variant experts=0 --variant experts=1 2>&1 | grep --line-buffered -vE "$F"
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 8,32,64 --context 1024 --steps 20 --warmup 3 \
  --variant experts=4 --variant experts=9 --variant experts=10 --variant experts=11 --variant experts=12 \
  --variant experts=13 --variant experts=14 --variant experts=15 2>&1 | grep --line-buffered -E 'variant|batch [0-9]+:|^\| [0-9]'
