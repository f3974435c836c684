# limit: 300
# The cluster decode attention resident beside three qkv GEMM CTAs (BENCHMARKS.md): the defaults (kQkvSlim 1: the
# one-token qkv GEMM without its norm weights in shared memory; kAttentionKernel 10: the compact cluster attention at
# most 128 registers) against the previous ones (slim=0, attn=8): the tests of these forms, then TPOT at batch 1 and 2
# (SERE S=2 too) alternating in one process.
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.Fused*:CudaLatencyGemm.NormFolded*:CudaDecoder.DownRows*' 2>&1 |
  grep -E "PASSED|FAILED|Failure|error" | head -12
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant "" --variant attn=8,slim=0 --variant "" --variant attn=8,slim=0 --variant attn=8,slim=0 --variant "" \
  2>&1 | grep -E "bandwidth|== variant|  batch"
