# limit: 75
# MoE prefill expert GEMMs: the warp-specialised variants (PrefillOption::kGroupedGemm 11-16) against variant 3
# (tests, per-op timings at T = 8192 and 2048, then the 2-layer end-to-end prefill with 11 and 3). Every command is
# under a timeout so a hung kernel cannot eat the batch; output line-buffered so a cut run still reports.
timeout 25 stdbuf -oL "$P/test_cuda" --gtest_filter='CudaMoePrefillWs.*:CudaPrefillKernels.Grouped*' 2>&1 \
  | grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
timeout 20 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192,2048 --ops --runs 10 \
  --variant-filter 'variant 3 (|variant 11 (|variant 12 (|variant 13 (|variant 14 (|variant 15 (|variant 16 (' 2>&1
for V in 11 3; do
  timeout 16 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 512,2048,8192 --layers 2 \
    --grouped-gemm $V 2>&1 | grep --line-buffered -E 'variant|MFU|^\| [0-9]|error'
done
