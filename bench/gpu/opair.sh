# limit: 240
# The small-M GEMM with K > 2048 tiles split over 2-CTA clusters (kGemmVariant 9: the o GEMM's 131 KB tile as two
# 66 KB halves, so that its CTAs fit beside the decode attention's) against the default (4): the small-M GEMM tests
# (variant 9 against the double-precision reference and bit for bit on a second launch), then TPOT at batches 1-32
# (SERE off and S=2), the two forms alternating in one process.
timeout 60 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaLatencyGemm*:CudaGemm*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
timeout 170 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,8,16,32 --steps 40 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant gemm=4 --variant gemm=9 --variant gemm=9 --variant gemm=4 2>&1 | grep -E "^== variant|^  batch|bandwidth"
