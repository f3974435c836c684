# limit: 300
# The fused one-token experts (moe_experts_fused, kMoeKernel 18: gate/up and the down product split over intermediate
# rows in one launch, the combine by its last CTA) against the default (moe_one variant 1 + its folded combine): the
# one-token expert tests (the fused form against the host reference of the layer tail, eager, in graphs and through
# moe_experts_decode_combine; graph replay times and CTA stamps printed), the decoder and graph tests, then TPOT at
# batches 1-8 (SERE off and S=2), the two forms alternating in one process.
timeout 90 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeOne*:CudaGraph*:CudaRoute.CompactKernelInDecoder*:CudaDecoder*:CudaSynthetic*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
timeout 150 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,4,8 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant experts=0 --variant experts=18 --variant experts=0 --variant experts=18 2>&1 | grep -vE '^sere_reroute alone'
