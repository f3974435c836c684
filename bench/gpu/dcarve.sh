# limit: 300
# DecodeOption::kDecodeCarveout: the small-M shared-memory GEMM (qkv, o) and the fused cluster decode attention at the
# largest shared-memory carveout (1, default) against the driver's default (0): the tests (decoder logits equal), then
# TPOT at batch 1, 2 and 8 in one process, alternating.
"$P/test_cuda" --gtest_filter='CudaDecoder.DownRows*:CudaDecodeAttention.*:CudaLatencyGemm.*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -30
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,8 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 --variant dcarve=1 --variant dcarve=0 --variant dcarve=0 --variant dcarve=1 \
  --variant dcarve=1 --variant dcarve=0 --variant dcarve=0 --variant dcarve=1 2>&1 | grep "variant:\|^| [0-9]\|error"
