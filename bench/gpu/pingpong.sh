# limit: 420
# The ping-pong expert GEMMs (grouped GEMM 14: each consumer warpgroup takes every other 128 x 128 tile whole;
# 15: 14 in clusters of two) after 342b830, where ptxas stopped serialising their wgmmas (C7520 "WG.AR in divergent
# path": the second row block's wgmma had sat under a condition). Measured 1.7x slower than the cooperative kernel
# with the same tile (12) while serialised. Their tests, then per op at 8k and 2k (variants 11, 12, 14, 15, timed
# next to each other, fp32 slots), then the whole model at 8k: the default (11, bf16 slots) against 14 and 15
# (14 with bf16 slots as the default; 15 with fp32 slots), alternating.
"$P/test_cuda" --gtest_filter='CudaMoePrefillWs.*' 2>&1 | grep -E '^\[  (PASSED|FAILED)|Failure|error' | head -8
timeout 150 "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192,2048 --ops --runs 10 \
  --variant-filter 'variant 11 (|variant 12 (|variant 14 (|variant 15 (' 2>&1 |
  grep -E '^T=|variant (11|12|14|15) |error'
for rep in 1 2; do
  for V in default 14 15; do
    if [ "$V" = default ]; then A=""; else A="--grouped-gemm $V"; fi
    timeout 60 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 $A 2>&1 |
      grep -E '^\| 8192|error' | sed "s/^/grouped $V: /"
  done
done
