# limit: 200
# Batch 1-2, the L2 hints of the small-M GEMMs in the current form (DecodeOption::kL2Prefetch): 0 (default: the qkv
# GEMM prefetches the layer's KV rows, qkv and o tiles copied evict-first), 2 (the KV prefetch, plain tiles), 4
# (none), 5 (as 0 with plain o tiles), alternating in one process.
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,2 --steps 60 --warmup 5 \
  --variant l2=0 --variant l2=2 --variant l2=4 --variant l2=5 --variant l2=5 --variant l2=4 --variant l2=2 \
  --variant l2=0 --variant l2=0 --variant l2=2 --variant l2=4 --variant l2=5 2>&1 | grep "variant:\|^| [0-9]\|error"
