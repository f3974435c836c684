# limit: 420
# The slim one-token qkv GEMM (DecodeOption::kQkvSlim: the norm weights in the registers of the absent token row's
# lanes instead of 4 KB of shared memory; 1 = at most 56 registers, 2 = 64) with the compact cluster attention
# (kAttentionKernel 10: 20 KB of V buffers, 164 registers; 11: the same at most 128 registers), so that an SM holding
# three qkv CTAs keeps room for an attention CTA on both counts and the clusters can become resident before the qkv
# CTAs leave: the tests of these forms, then TPOT at batch 1 and 2 (SERE S=2 too) alternating in one process.
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.Fused*:CudaLatencyGemm.NormFolded*:CudaDecoder.DownRows*' 2>&1 |
  grep -E "PASSED|FAILED|Failure|error" | head -12
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant "" --variant attn=11,slim=2 --variant attn=10,slim=1 --variant "" --variant attn=10,slim=1 \
  --variant attn=11,slim=2 --variant "" --variant attn=11,slim=2 --variant attn=10,slim=1 2>&1 |
  grep -E "bandwidth|== variant|  batch"
