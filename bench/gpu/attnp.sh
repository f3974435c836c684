# limit: 75
# Prefill attention variants 12-17 (warp-specialised: TMA producer, mbarrier stages, two consumer warpgroups; 15/16
# persistent) and the streaming q/k norm + RoPE + KV write (PrefillOption::kRope 2): their tests, then the per-op
# layer profile with the new kernels (ZEST_PREFILL_ATTENTION / ZEST_PREFILL_ROPE) against the previous defaults
# (attention 9, rope 1), then the 2-layer end-to-end prefill, new and old. Every step has its own time limit.
timeout 30 "$P/test_cuda" --gtest_filter='CudaPrefillWs*:CudaRopeStream*:CudaRope.*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
B="$P/bench_prefill_bench --config qwen3-30b-a3b"
NOVAR=""; ATT=""
if $B --help 2>&1 | grep -q variant-filter; then NOVAR="--variant-filter no-such-row"; ATT="--variant-filter attention"; fi
layer() { grep -E '^\| (q/k|prefill attention|layer)|^T=|max \|diff\|'; }
ops() {  # attention variant, rope variant, T, extra flags
  echo "=== T=$3, attention $1, rope $2"
  ZEST_PREFILL_ATTENTION=$1 ZEST_PREFILL_ROPE=$2 timeout 14 $B --tokens $3 --ops --runs 10 $4 2>&1 | layer
}
e2e() {
  echo "=== end to end, 2 layers, attention $1, rope $2"
  ZEST_PREFILL_ATTENTION=$1 ZEST_PREFILL_ROPE=$2 timeout 12 $B --tokens 512,2048,8192 --layers 2 2>&1 | grep -E '^\| [0-9]+ \||median'
}
echo "=== T=8192, attention 12, rope 2, attention variant rows compared with 12"
ZEST_PREFILL_ATTENTION=12 ZEST_PREFILL_ROPE=2 timeout 16 $B --tokens 8192 --ops --runs 10 $ATT 2>&1 |
  grep -E '^\| (q/k|prefill attention|layer)|^T=|attention.*max \|diff\|'
ops 15 2 8192 "$NOVAR"
ops 17 2 8192 "$NOVAR"
ops 9 1 8192 "$NOVAR"
e2e 12 2
e2e 9 1
for v in 13 14 16; do ops $v 2 8192 "$NOVAR"; done
ops 12 2 2048 "$NOVAR"
ops 9 1 2048 "$NOVAR"
# Decode-sized T (the rope kernel's small-T path): T = 1 and 64, rope 2 against 1.
for T in 1 64; do ops 12 2 $T "$NOVAR"; ops 9 1 $T "$NOVAR"; done
