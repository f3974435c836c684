# limit: 420
# Batch 1: the pair down CTAs prefetching the next layer's qkv weights into L2 from every thread once their own
# weights have landed (DecodeOption::kMoeDownRows 3: evict-last priority, 4: plain), and the qkv / o GEMM and the
# attention at the largest carveout (kAttnGate 3), against the defaults: the tests (x bit for bit), then TPOT in one
# process, alternating.
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaDecoder.DownRows*:CudaGraph*' 2>&1 | grep -B3 -A12 "Failure\|FAILED\|PASSED" | tail -30
A=gate=0; B=rows=3; C=rows=4; D=rows=3,gate=3
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 --variant $A --variant $B --variant $C --variant $D --variant $D --variant $C \
  --variant $B --variant $A --variant $A --variant $B --variant $D 2>&1 | grep "variant:\|^| [0-9]\|error"
