# limit: 200
# The step timeline's cost when off (the check before each PDL wait): TPOT at batch 1 and 8 of the package before it
# (.gpu/old.tar.xz, when carried) and of this one, alternating twice; then this package's decode attention variants at
# batch 1 with the timeline: attn=8 (default: cluster merge in clusters of up to 16 splits), 10 / 11 (clusters of at
# most 8 / 4), 2 (global merge, no clusters).
B="$P/bench_decode_bench"
ARGS="--config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5"
if [ -e .gpu/old.tar.xz ]; then
  rm -rf /tmp/zest-old && mkdir -p /tmp/zest-old && tar -xJf .gpu/old.tar.xz -C /tmp/zest-old
  echo "old package: $(cat /tmp/zest-old/pkg/commit 2>/dev/null)"
  for i in 1 2; do
    echo "== old"; timeout 30 /tmp/zest-old/pkg/bench_decode_bench $ARGS 2>&1 | grep -E '^  batch'
    echo "== new"; timeout 30 "$B" $ARGS 2>&1 | grep -E '^  batch'
  done
fi
timeout 25 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaStepTimeline*:CudaDecodeAttention.Fused*:CudaLatencyAttention*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 80 "$B" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 30 --warmup 5 --timeline 1 \
  --variant attn=8 --variant attn=10 --variant attn=11 --variant attn=2 2>&1 | grep -vE '^sere_reroute alone'
