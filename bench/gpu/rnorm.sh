# limit: 540
# The add + RMSNorm before the routing folded away (DecodeOption::kRouteNorm 1, the default: the o GEMM adds its
# output to x, the compact routing normalises x itself) against the chain (0): the tests (bit for bit against the
# chain), then batch 1 and 8 TPOT alternating in one process (ABBA twice), with SERE S=2 as well.
"$P/test_cuda" --gtest_filter='CudaLatencyGemm.Residual*:CudaRoute.*:CudaDecoder.*:CudaGraph*:CudaDecodeAttention.Fused*:CudaMoeOne.*' 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | grep -v "^\[batch\|^\[cuda-vs\|^variant\|^\[moe\|^  gate\|^  down\|^rows_mma\|^moe_one" | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -40
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant rnorm=0 --variant rnorm=1 --variant rnorm=2 --variant rnorm=2 --variant rnorm=1 --variant rnorm=0 \
  --variant rnorm=0 --variant rnorm=2 --variant rnorm=1 2>&1 | grep "variant:\|^| [0-9]\|error"
