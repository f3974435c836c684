# limit: 240
# Batch 1: the one-token experts with the down projection by output rows (experts=18: moe_one variant 2, the slots
# summed where computed, the last CTA normalising) against variant 1 (experts=17, the default), in one process
# (Qwen3-30B-A3B shapes, context 1024, one H200). First the tests involved.
timeout 100 "$P/test_cuda" --gtest_brief=1 \
  --gtest_filter='CudaMoeOne*:CudaNorm*:CudaDecoder*:CudaSynthetic*:CudaGraph*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]|^\[(cuda-vs-cpu|batch-vs-solo)\]' | tail -22
timeout 130 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant experts=17 --variant experts=18 --variant experts=17 --variant experts=18 2>&1 | grep -E "^== |TPOT [0-9]"
