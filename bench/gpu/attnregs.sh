# limit: 200
# The fused decode attention capped at 152 registers (default, attn=8: two of its CTAs and one o GEMM CTA fit on an
# SM) against the previous 168 (attn=10): the attention tests, then TPOT at batch 1 and 8, alternating in one process.
timeout 60 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaDecodeAttention*:CudaLatencyDecoder*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 130 "$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant attn=8 --variant attn=10 --variant attn=10 --variant attn=8 --variant attn=8 --variant attn=10 \
  2>&1 | grep -vE '^sere_reroute alone'
