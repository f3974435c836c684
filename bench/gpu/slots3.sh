# limit: 200
# bf16 slots with 8-byte stores after a pair swap: the tests of the grouped GEMMs and of the decoder's bf16 slots, the
# per-op profile at 8k (fp32-slot rows as variants), then the whole-model prefill with bf16 and fp32 slots alternating.
timeout 60 stdbuf -oL "$P/test_cuda" --gtest_filter='CudaMoePrefillWs.*:CudaNorm.MoeCombine*:CudaDecoder.PrefillBf16SlotsSameLogits' 2>&1 | grep --line-buffered -E 'PASSED|FAILED|Failure|error'
timeout 40 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --ops --runs 10 \
  --variant-filter 'fp32 slots' 2>&1 | grep -E 'experts|combine|plan|layer|slots vs'
for S in 0 1 0 1; do
  ZEST_PREFILL_SLOTS=$S timeout 40 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 2>&1 \
    | grep -E '^\| 8192|error' | sed "s/^/slots $S: /"
done
