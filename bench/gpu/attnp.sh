# limit: 60
# Prefill attention (default: variant 15, persistent warp-specialised, above 256 tokens) and q/k norm + RoPE + KV
# write (default: streaming kernel, PrefillOption::kRope 2): their tests, the per-op rows at T=8192 and 2048 against
# the previous defaults (ZEST_PREFILL_ATTENTION=9 ZEST_PREFILL_ROPE=1), variant 18 at T=8192, then the 2-layer
# end-to-end prefill, new and old. Every step has its own time limit.
timeout 18 "$P/test_cuda" --gtest_filter='CudaPrefillWs*:CudaRopeStream*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
B="$P/bench_prefill_bench --config qwen3-30b-a3b"
NOVAR=""
if $B --help 2>&1 | grep -q variant-filter; then NOVAR="--variant-filter no-such-row"; fi
ops() {  # attention variant, rope variant (empty: defaults), T
  echo "=== T=$3, attention ${1:-default}, rope ${2:-default}"
  env ${1:+ZEST_PREFILL_ATTENTION=$1} ${2:+ZEST_PREFILL_ROPE=$2} timeout 8 $B --tokens $3 --ops --runs 10 $NOVAR 2>&1 |
    grep -E '^\| (q/k|prefill attention|layer)|max \|diff\|'
}
e2e() {
  echo "=== end to end, 2 layers, attention ${1:-default}, rope ${2:-default}"
  env ${1:+ZEST_PREFILL_ATTENTION=$1} ${2:+ZEST_PREFILL_ROPE=$2} timeout 9 $B --tokens 512,2048,8192 --layers 2 2>&1 |
    grep -E '^\| [0-9]+ \||median'
}
ops "" "" 8192
ops 9 1 8192
ops "" "" 2048
ops 9 1 2048
e2e "" ""
e2e 9 1
ops 18 "" 8192
