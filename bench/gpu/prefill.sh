# limit: 240
# Prefill kernels: their tests, the per-op profile of one layer (one process per T), then the end-to-end
# prefill benchmark.
"$P/test_cuda" --gtest_filter='CudaPrefill*:CudaMoeExperts.Prefill*:CudaDecoder*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
"$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --ops --runs 10
"$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 2048 --ops --runs 10
"$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 512,2048,8192 --layers 2
