# limit: 300
# The layer's MoE combine folded into the streaming experts (kMoeCombine 2) against the separate launch (1): the MoE
# stream, one-token, routing, decoder and graph tests, then TPOT at batches 1-64 (SERE off and S=2), the two forms
# alternating in one process.
timeout 150 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeStream*:CudaMoeOne*:CudaMoePlan*:CudaRoute*:CudaGraph*:CudaDecoder*:CudaSynthetic*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]' | grep -v "^\[batch-vs-solo\]\|^\[cuda-vs-cpu\]"
echo "test_cuda exit: ${PIPESTATUS[0]}"
timeout 140 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,8,32,64 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant combine=1 --variant combine=2 --variant combine=2 --variant combine=1 2>&1 |
  grep -E "^== variant|^  batch|bandwidth"
