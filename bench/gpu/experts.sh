# limit: 60
# Decode experts: the persistent bulk-copy streaming kernel (moe_stream.cu; --variant experts=2..9 = its variants
# 0-7; measured fastest on H200 at 3b53126: experts=9 at batch 32/64, experts=4 at batch 8) against the rows_mma
# gate/up + down kernels (experts=1, the default). First the decode-expert tests, then TPOT at batch 1/8/32/64 (SERE
# off and S=2) per kernel, with the experts' ablation at batch 8 and 64 for experts=9 and for rows_mma.
# Output is line-buffered so that a cut run still reports.
timeout 25 "$P/test_cuda" --gtest_filter='CudaMoeStream*:CudaMoeExperts.Decode*:CudaMoePlan*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 50 --warmup 5 --ablate 8,64 --ablate-steps 8 --variant experts=9 --variant experts=1 --variant experts=4 2>&1 |
  grep --line-buffered -vE '^    (qkv|qk norm|o gemm|add|router|lm_head|moe plan|moe combine|decode attention|ablation)|^sere_reroute'
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 8,64 --context 1024 --steps 10 --warmup 3 --ablate 8,64 \
  --ablate-steps 8 --variant experts=1 2>&1 | grep --line-buffered -E 'batch|moe experts|variant'
