# limit: 300
# DecodeOption::kCombineGate: the next layer's qkv tile copies held back on SMs whose separate MoE combine CTA still
# loads its row (1: until its loads have landed; 2: until its end) against none (0, default): the tests (decoder
# logits bit for bit, marks cleared; the combine and GEMM suites), then TPOT at batch 1 (a control: the combine is
# folded there), 4 and 8 in one process, alternating.
"$P/test_cuda" --gtest_filter='CudaDecoder.DownRows*:CudaNorm.*:CudaLatencyGemm.*:CudaGraph*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -30
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,4,8 --steps 60 --warmup 5 \
  --variant cgate=0 --variant cgate=1 --variant cgate=2 --variant cgate=1 --variant cgate=0 \
  --variant cgate=0 --variant cgate=2 --variant cgate=1 --variant cgate=0 2>&1 | grep "variant:\|^| [0-9]\|error"
