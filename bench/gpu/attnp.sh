# limit: 60
# Prefill attention default (variant 15, persistent warp-specialised) with the partial-tile copies spread over the
# four producer warps: tests and a memcheck pass over the new kernels, then T=8192 against variant 9, and the
# short-sequence crossover (T = 64, 128, 256) of variant 15 against 9. Every step has its own time limit.
timeout 20 "$P/test_cuda" --gtest_filter='CudaPrefillWs*:CudaRopeStream*:CudaPrefillKernels.Attention*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 12 compute-sanitizer --tool memcheck --error-exitcode 3 "$P/test_cuda" \
  --gtest_filter='CudaPrefillWs.VarlenOddLengthsAndLengthOne' 2>&1 |
  grep -E 'ERROR SUMMARY|PASSED|FAILED|Invalid|out of bounds' | head -8
B="$P/bench_prefill_bench --config qwen3-30b-a3b"
NOVAR=""
if $B --help 2>&1 | grep -q variant-filter; then NOVAR="--variant-filter no-such-row"; fi
layer() { grep -E '^\| (q/k|prefill attention|layer)|^T=|max \|diff\|'; }
ops() {  # attention variant, rope variant (empty: defaults), T
  echo "=== T=$3, attention ${1:-default}, rope ${2:-default}"
  env ${1:+ZEST_PREFILL_ATTENTION=$1} ${2:+ZEST_PREFILL_ROPE=$2} timeout 10 $B --tokens $3 --ops --runs 10 $NOVAR 2>&1 |
    grep -E '^\| (q/k|prefill attention)|max \|diff\|'
}
ops "" "" 8192
ops 9 "" 8192
for T in 128 64 256; do ops 15 "" $T; ops 9 "" $T; done
