# limit: 420
# The o GEMM's tile copies held back on SMs whose fused-attention CTA attends its pages (DecodeOption::kAttnGate 1:
# until the CTA's pages are attended; 2: until its end) against the default (0): the tests (attention variants with
# the gated o GEMM bit for bit against gemm, the marks cleared; decoder logits equal), then TPOT at batch 1 and 2
# alternating in one process, then (timeline package, if carried) the attention's phases with and without the gate.
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.*:CudaDecoder.DownRows*:CudaGraph*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -30
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant gate=0 --variant gate=1 --variant gate=2 --variant gate=1 --variant gate=0 --variant gate=0 \
  --variant gate=1 --variant gate=2 --variant gate=1 --variant gate=0 2>&1 | grep "variant:\|^| [0-9]\|error"
