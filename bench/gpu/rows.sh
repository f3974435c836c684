# limit: 400
# The one-token down projection by output rows in CTA pairs with the norm folded into the next qkv GEMM
# (DecodeOption::kMoeDownRows 1, the default; 2: as 1 with the gate/up kernel's carveout leaving room for a pair CTA):
# its tests, then batch-1 TPOT against the folded combine (rows=0), alternating in one process.
"$P/test_cuda" --gtest_filter='CudaLatencyGemm.Norm*' 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | head -30
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaLatencyGemm.*:CudaDecoder*:CudaGraph*' 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | grep -v "^\[batch\|^\[cuda-vs\|^\[moe\|^variant\|^  gate\|^  down\|^rows_mma\|^moe_one" | tail -25
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --variant rows=0 --variant rows=1 --variant rows=2 --variant rows=0 --variant rows=2 --variant rows=1 \
  --variant rows=0 --variant rows=1 --variant rows=2 --variant rows=0 2>&1 | grep "TPOT"
