# limit: 480
# The fused decode attention's latency forms (DecodeOption::kAttnLatency: bit 0 = the prologue's independent loads in
# one round, bit 1 = the cluster merge spread over the cluster's CTAs; 3 = both, the default): the attention tests
# (every form bit for bit against form 0), then batch 1 and 8 TPOT alternating in one process.
"$P/test_cuda" --gtest_filter='CudaDecodeAttention.*:CudaLatencyAttention.*:CudaDecoder*:CudaGraph*' 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | grep -v "^\[batch\|^\[cuda-vs\|^variant" | tail -15
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 60 --warmup 5 \
  --variant alat=0 --variant alat=3 --variant alat=1 --variant alat=2 --variant alat=2 --variant alat=1 \
  --variant alat=3 --variant alat=0 --variant alat=0 --variant alat=3 2>&1 | grep "TPOT"
