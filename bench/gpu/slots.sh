# limit: 420
# Prefill with bf16 slot outputs (PrefillOption::kSlots 0, default) against fp32 slots (ZEST_PREFILL_SLOTS=1), and
# the plan kernel with batched id loads: the tests of the changed kernels, the per-op profile at 8k (the fp32-slot
# rows come as variant rows), then the whole-model prefill (48 layers on the device) with each slot form.
timeout 120 stdbuf -oL "$P/test_cuda" --gtest_filter='CudaMoePrefillWs.*:CudaNorm.*:CudaPrefillKernels.*:CudaDecoder.PrefillBf16SlotsSameLogits:CudaDecoder.HeadDim128*' 2>&1 | grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
timeout 40 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --ops --runs 10 \
  --variant-filter 'fp32 slots' 2>&1
for S in 0 1 0; do
  start=$(date +%s)
  ZEST_PREFILL_SLOTS=$S timeout 100 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 512,2048,8192 2>&1 \
    | grep --line-buffered -E 'model:|MFU|^\| [0-9]|error|median'
  echo "(ZEST_PREFILL_SLOTS=$S, $(($(date +%s) - start)) s)"
done
