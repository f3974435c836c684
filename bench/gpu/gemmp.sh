# limit: 60
# MoE prefill expert GEMMs: the warp-specialised default (PrefillOption::kGroupedGemm 11) against variant 3 and the
# closest alternatives (13: two-CTA clusters with the weight tile multicast; 18: down's epilogue inputs loaded
# early; 20: outputs stored during the next tile's GEMM; 11 timed again last for the drift): tests, per-op timings
# at T = 8192, 2048 and 512, then the 2-layer end-to-end prefill with the default and with variant 3 (the last
# command may be cut by the time limit; every command is under a timeout, output line-buffered).
timeout 16 stdbuf -oL "$P/test_cuda" --gtest_filter='CudaMoePrefillWs.*' 2>&1 | grep --line-buffered -vE '^\[ +RUN +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
timeout 19 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192,2048,512 --ops --runs 10 \
  --variant-filter 'experts gate/up, variant 3 (|experts down, variant 3 (|variant 11 (|variant 13 (|variant 18 (|variant 20 (' 2>&1
for V in default 3; do
  if [ "$V" = default ]; then A=""; else A="--grouped-gemm $V"; fi
  timeout 12 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 512,2048,8192 --layers 2 $A 2>&1 \
    | grep --line-buffered -E 'variant|MFU|^\| [0-9]|error'
  echo "(grouped GEMM: $V)"
done
