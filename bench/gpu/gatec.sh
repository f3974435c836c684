# limit: 420
# Largest shared-memory carveouts along the decode chain (DecodeOption::kAttnGate): 3 = the small-M shared-memory
# GEMM (qkv, o) and the fused cluster attention, 5 = 3 and the one-token down kernel by rows, 6 = 5 and the compact
# routing kernel, against the defaults (0): the decoder test (logits equal), then TPOT at batch 1, 2 and 8 in one
# process, alternating.
"$P/test_cuda" --gtest_filter='CudaDecoder.DownRows*:CudaMoeOne.*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -30
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,8 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 --variant gate=0 --variant gate=3 --variant gate=5 --variant gate=6 \
  --variant gate=6 --variant gate=5 --variant gate=3 --variant gate=0 --variant gate=0 --variant gate=3 \
  --variant gate=5 --variant gate=6 2>&1 | grep "variant:\|^| [0-9]\|error"
