# limit: 300
# Whole-model prefill (48 layers; the GPU runs at its power limit and lowers its clock): does the two-CTA cluster
# with the weight tile multicast (grouped GEMM 13, a third less L2 traffic, equal speed at full clock) gain when
# power bounds the clock? 11 and 13 with fp32 slots (ZEST_PREFILL_SLOTS=1, so only the multicast differs), and the
# default (11, bf16 slots), alternating.
for rep in 1 2; do
  for V in 11 13 default; do
    if [ "$V" = default ]; then A=""; S=0; else A="--grouped-gemm $V"; S=1; fi
    ZEST_PREFILL_SLOTS=$S timeout 60 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 $A 2>&1 \
      | grep -E '^\| 8192|error' | sed "s/^/grouped $V slots $S: /"
  done
done
