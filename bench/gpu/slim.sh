# limit: 420
# The slim one-token qkv GEMM (DecodeOption::kQkvSlim 1: norm weights through L1, at most 56 registers) with the
# compact cluster attention (kAttentionKernel 10: 20 KB of V buffers), so that an SM holding three qkv CTAs keeps
# room for an attention CTA on both counts and the clusters can become resident before the qkv CTAs leave: the
# tests of both forms, then TPOT at batch 1 (SERE S=2 too) alternating in one process. slim=2 / attn=11: the same
# with the qkv GEMM at 64 registers and the attention at 128 (spills); slim=3: the norm weights in the registers of
# the lanes whose token row is absent.
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.Fused*:CudaLatencyGemm.NormFolded*:CudaDecoder.DownRows*' 2>&1 |
  grep -E "PASSED|FAILED|Failure|error" | head -12
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant "" --variant slim=3 --variant attn=11,slim=3 --variant attn=11,slim=2 --variant "" \
  --variant attn=11,slim=3 --variant slim=3 --variant "" --variant attn=11,slim=3 --variant attn=11,slim=2 2>&1 |
  grep -E "bandwidth|== variant|  batch"
