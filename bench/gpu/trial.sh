# limit: 200
# Temporary measurement (DecodeOption::kTrial): the separate MoE combine launch reserving 200 KB (trial=1) or 100 KB
# (trial=2) of shared memory, so that no (or one) CTA of the next qkv GEMM, whose weight tiles stream before its wait,
# shares its SMs; against the default (0). Batch 8 (separate combine) and batch 1 with the combine not folded
# (combine=0) and folded (default).
timeout 60 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeExperts*:CudaSynthetic*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
timeout 120 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant trial=0 --variant trial=1 --variant trial=2 --variant combine=0 --variant combine=0,trial=1 \
  --variant combine=0,trial=1 --variant combine=0 --variant trial=2 --variant trial=1 --variant trial=0 2>&1 |
  grep -E '== variant|batch [0-9]+: TPOT'
