# limit: 75
# Prefill attention variants 12-14 (warp-specialised: TMA producer, mbarrier stages, two consumer warpgroups) and
# the streaming q/k norm + RoPE + KV write (PrefillOption::kRope 2): their tests, then the per-op layer profile with
# the new kernels (ZEST_PREFILL_ATTENTION / ZEST_PREFILL_ROPE) against the previous defaults (attention 9, rope 1),
# then the 2-layer end-to-end prefill, new and old.
"$P/test_cuda" --gtest_filter='CudaPrefillWs*:CudaRopeStream*:CudaRope.*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
B="$P/bench_prefill_bench --config qwen3-30b-a3b"
NOVAR=""; ATT=""
if $B --help 2>&1 | grep -q variant-filter; then NOVAR="--variant-filter no-such-row"; ATT="--variant-filter attention"; fi
layer() { grep -E '^\| (q/k|prefill attention|layer)|^T=|max \|diff\|'; }
echo "=== T=8192, new: attention 12, rope 2 (attention variant rows for comparison)"
ZEST_PREFILL_ATTENTION=12 ZEST_PREFILL_ROPE=2 $B --tokens 8192 --ops --runs 10 $ATT 2>&1 | grep -vE '^\| (experts|moe|router|o gemm|qkv gemm|residual|combine)'
echo "=== T=8192, old: attention 9, rope 1"
ZEST_PREFILL_ATTENTION=9 ZEST_PREFILL_ROPE=1 $B --tokens 8192 --ops --runs 10 $NOVAR 2>&1 | layer
echo "=== end to end, 2 layers, new"
ZEST_PREFILL_ATTENTION=12 ZEST_PREFILL_ROPE=2 $B --tokens 512,2048,8192 --layers 2 2>&1 | tail -12
echo "=== end to end, 2 layers, old"
ZEST_PREFILL_ATTENTION=9 ZEST_PREFILL_ROPE=1 $B --tokens 512,2048,8192 --layers 2 2>&1 | tail -12
for v in 15 13 14 16; do
  echo "=== T=8192, attention $v"
  ZEST_PREFILL_ATTENTION=$v ZEST_PREFILL_ROPE=2 $B --tokens 8192 --ops --runs 10 $NOVAR 2>&1 | layer
done
for cfg in "12 2" "9 1"; do
  set -- $cfg
  echo "=== T=2048, attention $1, rope $2"
  ZEST_PREFILL_ATTENTION=$1 ZEST_PREFILL_ROPE=$2 $B --tokens 2048 --ops --runs 10 $NOVAR 2>&1 | layer
done
