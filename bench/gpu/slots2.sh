# limit: 420
# Prefill: bf16 slots stored 16 bytes per lane, the plan in two launches. Tests of the changed kernels, the per-op
# profile at 8k (fp32-slot rows as variants), the whole-model prefill with bf16 and fp32 slots alternating (SM clock
# and power sampled every 100 ms meanwhile: clocks.txt), then the 2-layer extrapolation for comparison.
timeout 120 stdbuf -oL "$P/test_cuda" --gtest_filter='CudaMoePrefillWs.*:CudaNorm.*:CudaPrefillKernels.*:CudaDecoder.PrefillBf16SlotsSameLogits:CudaDecoder.HeadDim128*:CudaMoe*Plan*' 2>&1 | grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
timeout 40 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --ops --runs 10 \
  --variant-filter 'fp32 slots' 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > "${OUT:-/tmp}/clocks.txt" 2>&1 &
SMI=$!
for S in 0 1 0 1; do
  start=$(date +%s)
  ZEST_PREFILL_SLOTS=$S timeout 100 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 2048,8192 2>&1 \
    | grep --line-buffered -E 'MFU|^\| [0-9]|error|median'
  echo "(ZEST_PREFILL_SLOTS=$S, $(($(date +%s) - start)) s)"
done
kill $SMI
timeout 40 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --layers 2 2>&1 | grep -E 'MFU|^\| [0-9]|error|median'
sort -t, -k2 -n "${OUT:-/tmp}/clocks.txt" | awk -F, '{print $2}' | uniq -c | sort -k2 -n | tail -12
