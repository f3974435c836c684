# limit: 150
# The layer's MoE combine folded into the one-token experts' down kernel (kMoeCombine 1: its last CTA runs
# moe_combine_add_rmsnorm's rows) against the separate launch (kMoeCombine 0): the one-token expert tests (bit for bit
# against the separate launch, eager and in graphs), the decoder graph tests, then TPOT at batch 1 and 8 (SERE off and
# S=2), the two forms alternating in one process.
timeout 80 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeOne*:CudaGraph*:CudaRoute.CompactKernelInDecoder*:CudaDecoder*:CudaSynthetic*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 60 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant combine=1 --variant combine=0 --variant combine=1 --variant combine=0 2>&1 | grep -vE '^sere_reroute alone'
