# limit: 420
# decode_attention_o (DecodeOption::kAttentionO): its tests and the decoder / graph tests, then TPOT with the
# attention and the o projection in one launch (ao=1, ao=2) against two launches (ao=0), alternating in one process.
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.*:CudaDecoder.*:CudaGraph*:CudaLatency*' 2>&1 | tail -40
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,4,8 --steps 40 --warmup 5 \
  --variant ao=0 --variant ao=2 --variant ao=0 --variant ao=2 2>&1
