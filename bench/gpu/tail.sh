# limit: 240
# Batch 1 around the folded MoE combine (Qwen3-30B-A3B shapes, context 1024, one H200), in one process: combine=1
# (default: every down CTA loads its norm weights before counting itself), combine=2 (only the last CTA loads them,
# with its row), combine=3 (2, and the down CTAs prefetch the next layer's qkv weights into L2 once their items are
# done), and the add + RMSNorm folded into the o GEMM (nfold=1, default) or not. First the tests involved.
timeout 100 "$P/test_cuda" --gtest_brief=1 \
  --gtest_filter='CudaLatencyGemm*:CudaNorm*:CudaMoeOne*:CudaDecoder*:CudaSynthetic*:CudaGraph*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]|^\[(cuda-vs-cpu|batch-vs-solo)\]|^(variant|  gate|  down|rows_mma|moe_one)' | tail -12
timeout 130 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant combine=1 --variant combine=2 --variant combine=3 --variant nfold=0 --variant combine=3,nfold=0 \
  --variant combine=1 --variant combine=2 --variant combine=3 --variant nfold=0 2>&1 | grep -E "^== |TPOT [0-9]"
