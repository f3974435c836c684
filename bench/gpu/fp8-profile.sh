# limit: 300
# Where issue 42's FP8 decode step spends its time (one GPU; package from bench/gpu-package.sh): each kernel of one
# replayed decode layer at batch 1 and 64 (ncu, serialised: duration and DRAM bytes; batch 8's is in BENCHMARKS.md).
# At batch 64 the FP8 context prefill (8 chunks of 8k tokens, ~13 matching launches a layer with the tensor-core GEMMs)
# comes first: skipped (~5000 launches).
NCU_ONLY=1 NCU_BATCHES="1" NCU_TIMEOUT=100 NCU_COUNT=12 BENCH_ARGS="--dtype fp8" timeout 110 bash bench/gpu/profile.sh
NCU_ONLY=1 NCU_BATCHES="64" NCU_LAYER_SKIP=6500 NCU_TIMEOUT=170 NCU_COUNT=24 BENCH_ARGS="--dtype fp8" timeout 180 \
  bash bench/gpu/profile.sh
