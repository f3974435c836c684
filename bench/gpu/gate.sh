# limit: 420
# The o GEMM's tile copies held back on SMs whose fused-attention CTA attends its pages (DecodeOption::kAttnGate 1:
# until the CTA's pages are attended; 2: until its end; 3: no marks, the qkv / o GEMM and the attention at the
# largest carveout; 4: 3 and 1) against the default (0): the tests (attention variants with
# the gated o GEMM bit for bit against gemm, the marks cleared; decoder logits equal), then TPOT at batch 1 and 2
# alternating in one process, then (timeline package, if carried) the attention's phases with and without the gate.
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.*:CudaDecoder.DownRows*:CudaGraph*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -30
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2,8 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant gate=0 --variant gate=3 --variant gate=4 --variant gate=3 --variant gate=0 --variant gate=0 \
  --variant gate=3 --variant gate=4 --variant gate=3 --variant gate=0 2>&1 | grep "variant:\|^| [0-9]\|error"
if [ -f .gpu/zest-timeline.tar.xz ]; then
  rm -rf /tmp/zest-tl && mkdir -p /tmp/zest-tl && tar -xJf .gpu/zest-timeline.tar.xz -C /tmp/zest-tl
  for g in 0 1; do
    ZEST_TIMELINE_RAW=${OUT:-/tmp}/gate$g timeout 60 /tmp/zest-tl/pkg/bench_decode_timeline --config qwen3-30b-a3b \
      --context 1024 --batch 1 --steps 30 --warmup 5 --timeline 1 --variant gate=$g 2>&1 | grep "variant:\|^    |\|layer:"
    echo "== gate=$g: attention pages by the o GEMM's entry on the SM"
    python3 bench/timeline_raw.py "${OUT:-/tmp}/gate$g-b1.txt" --neighbours decode_attention_fused
  done
fi
