# limit: 150
# The early plan (kEarlyExperts 1: the decode routing publishes its one-token plan through a flag and the experts'
# gate/up CTAs start loading before their programmatic-dependent-launch wait) against loads after the wait
# (early=0): the tests of the kernels and decoders involved, then TPOT at batch 1 and 8 (SERE off and S=2), the two
# forms alternating in one process.
timeout 90 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaMoeOne*:CudaRoute*:CudaGraph*:CudaDecoder*:CudaSynthetic*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 55 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 60 --warmup 10 \
  --sere-primary 2 --sere-threshold 0 \
  --variant early=1 --variant early=0 --variant early=1 --variant early=0 2>&1 | grep -vE '^sere_reroute alone'
