# limit: 420
# decode_attention_o (DecodeOption::kAttentionO): its tests and the decoder test, then TPOT with the attention and
# the o projection in one launch (ao=2 cooperative, ao=3 plain PDL launch) against two launches (ao=0).
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.Fused*:CudaDecoder.AttentionO*' 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | head -80
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,8 --steps 40 --warmup 5 \
  --variant ao=0 --variant ao=2 --variant ao=3 --variant ao=0 --variant ao=3 2>&1 | grep -v "^|\|sere_reroute"
