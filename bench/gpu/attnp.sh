# limit: 75
# Prefill attention (default now: variant 15, the persistent warp-specialised kernel, above 256 tokens) and
# q/k norm + RoPE + KV write (default now: PrefillOption::kRope 2, streaming): tests (with the new defaults, the
# prefill and decoder suites too), a memcheck pass over the new kernels' small cases, the per-op layer profile
# against the previous defaults (ZEST_PREFILL_ATTENTION=9 ZEST_PREFILL_ROPE=1), the short-sequence crossover,
# then the 2-layer end-to-end prefill. Every step has its own time limit.
timeout 40 "$P/test_cuda" --gtest_filter='CudaPrefillWs*:CudaRopeStream*:CudaRope.*:CudaPrefill*:CudaDecoder*:CudaAttention*' 2>&1 |
  grep -vE '^\[ +(RUN|OK) +\]'
timeout 20 compute-sanitizer --tool memcheck --error-exitcode 3 "$P/test_cuda" \
  --gtest_filter='CudaPrefillWs.VarlenOddLengthsAndLengthOne:CudaPrefillWs.WholeTilesOnlyTakeTheTmaPath:CudaRopeStream.DecodeSizes' 2>&1 |
  grep -E 'ERROR SUMMARY|PASSED|FAILED|Invalid|out of bounds' | head -8
B="$P/bench_prefill_bench --config qwen3-30b-a3b"
NOVAR=""
if $B --help 2>&1 | grep -q variant-filter; then NOVAR="--variant-filter no-such-row"; fi
layer() { grep -E '^\| (q/k|prefill attention|layer)|^T=|max \|diff\|'; }
ops() {  # attention variant, rope variant (empty: defaults), T
  echo "=== T=$3, attention ${1:-default}, rope ${2:-default}"
  env ${1:+ZEST_PREFILL_ATTENTION=$1} ${2:+ZEST_PREFILL_ROPE=$2} timeout 14 $B --tokens $3 --ops --runs 10 $NOVAR 2>&1 | layer
}
e2e() {
  echo "=== end to end, 2 layers, attention ${1:-default}, rope ${2:-default}"
  env ${1:+ZEST_PREFILL_ATTENTION=$1} ${2:+ZEST_PREFILL_ROPE=$2} timeout 12 $B --tokens 512,2048,8192 --layers 2 2>&1 |
    grep -E '^\| [0-9]+ \||median'
}
ops "" "" 8192
ops 9 1 8192
ops "" 3 8192
e2e "" ""
e2e 9 1
ops "" "" 2048
ops 9 1 2048
for T in 256 512; do ops 15 "" $T; ops 12 "" $T; ops 9 "" $T; done
ops 17 "" 8192
