# limit: 240
# Grouped GEMM variant 21 (11 with gate/up's h stored 8 bytes per lane after a pair swap, as the bf16 slots are):
# the grouped-GEMM tests (21 in every case list), the per-op rows of 11 and 21 at 8k and 2k, then the whole-model
# prefill with the default (11) and 21 alternating (both with bf16 slots).
timeout 60 stdbuf -oL "$P/test_cuda" --gtest_filter='CudaMoePrefillWs.*' 2>&1 | grep --line-buffered -E 'PASSED|FAILED|Failure'
timeout 40 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192,2048 --ops --runs 10 \
  --variant-filter 'gate/up, variant 11 (|gate/up, variant 21 (' 2>&1 | grep -E 'gate/up|variant 21 vs'
for rep in 1 2; do
  for V in default 21; do
    if [ "$V" = default ]; then A=""; else A="--grouped-gemm $V"; fi
    timeout 40 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 $A 2>&1 \
      | grep -E '^\| 8192|error' | sed "s/^/grouped $V: /"
  done
done
