# limit: 150
# Prefill at 8k: the per-op profile of one layer (default kernels, plus the grouped-GEMM variants 18 and 20 and
# the attention variants 15 and 18 as rows), then the 2-layer end-to-end prefill three times (the check's figure).
timeout 40 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --ops --runs 10 \
  --variant-filter 'variant 18 (|variant 20 (|variant 15 (' 2>&1
for i in 1 2 3; do
  timeout 25 stdbuf -oL "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --layers 2 2>&1 | grep -E 'MFU|^\| [0-9]|error'
done
