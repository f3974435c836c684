# limit: 590
# Issue 44's runs on a machine with two GPUs or more (kind nvidia-h100-x2 / nvidia-h200-x2 or larger; package from
# bench/gpu-package.sh): the two-GPU test of NCCL ranks, then Qwen3-30B-A3B decode on one GPU and split over two
# (expert parallel, and experts by columns) in the same job, then the 235B-A22B shape in FP8 cut to 24 layers on two
# GPUs at batch 1 and 32.
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
"$P/test_cuda" --gtest_filter='CudaDecoder.NcclRanks*:CudaDecoder.SplitOverRanks*' 2>&1 | grep -E 'split-vs-whole|OK|FAILED|PASSED|SKIPPED'
for tp in "" "--tensor-parallel 2 --expert-parallel" "--tensor-parallel 2"; do
  echo "=== qwen3-30b-a3b ${tp:-one GPU}"
  timeout 150 "$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --steps 50 --warmup 5 $tp \
    2>&1 | grep -E '^\||copy bandwidth|split over|error'
done
# With --comm-off the same steps skip the all-reduces: 1 - t(off) / t(on) is the share spent in communication.
for comm in "" "--comm-off"; do
  echo "=== qwen3-vl-235b-a22b, FP8, 24 layers, two GPUs, experts placed whole ${comm}"
  timeout 150 "$P/bench_decode_bench" --config qwen3-vl-235b-a22b --layers 24 --dtype fp8 --batch 1,32 --context 1024 \
    --steps 30 --warmup 5 --tensor-parallel 2 --expert-parallel $comm 2>&1 | grep -E '^\||split over|error'
done
