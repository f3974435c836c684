# limit: 200
# The fused decode attention with eight warps per CTA (kAttentionKernel 10: the cluster merge's splits, one page per
# warp at 1k tokens, one query head per warp in the q / k norm) against the default (8, i.e. 3 at batch 1-2): the
# decode-attention tests, then TPOT at batch 1 and 2 (SERE off and S=2), alternating in one process.
timeout 90 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaDecodeAttention*:CudaLatencyAttention*:CudaGraph*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
timeout 100 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant attn=8 --variant attn=10 --variant attn=10 --variant attn=8 --variant attn=8 --variant attn=10 2>&1 |
  grep -E "^== variant|^  batch|bandwidth"
