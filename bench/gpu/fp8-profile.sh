# limit: 590
# Where issue 42's FP8 kernels spend their time (one GPU; package from bench/gpu-package.sh): each kernel of one
# replayed decode layer at batch 1 and 64 (ncu, serialised: duration and DRAM bytes; batch 8's is in BENCHMARKS.md),
# the per-instruction warp stalls of the one-token gate/up (the tile kernel's launch 102 of a step is layer 25's
# gate/up; 103 its down), and the stall reasons of the prefill experts' FP8 tensor-core gate/up at 8k tokens (its
# chunks take ~1.06 us against ~0.65 us in the dense products of the same kernel: BENCHMARKS.md).
NCU_ONLY=1 NCU_BATCHES="1 64" NCU_TIMEOUT=120 NCU_COUNT=12 BENCH_ARGS="--dtype fp8" timeout 250 bash bench/gpu/profile.sh
NCU_SKIP=102 NCU_ONLY=1 NCU_TIMEOUT=100 NCU_SOURCE=fp8_tile NCU_BATCH=1 BENCH_ARGS="--dtype fp8" timeout 110 \
  bash bench/gpu/profile.sh
# The dense product at 64 rows (qkv: 30 us for 10 MB, 25% occupancy, barrier stalls first): where its warps wait.
NCU_SKIP=100 NCU_ONLY=1 NCU_TIMEOUT=100 NCU_SOURCE=fp8_tile NCU_BATCH=64 BENCH_ARGS="--dtype fp8" timeout 110 \
  bash bench/gpu/profile.sh
echo "== ncu: prefill experts' FP8 gate/up at 8192 tokens (bench_prefill_bench --ops) =="
timeout 100 ncu --clock-control none --kernel-name-base demangled -k 'regex:gemm_fp8_tc_kernel<.*(0|kGateUp)>' --launch-skip 2 \
  --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --ops --runs 4 2>&1 |
  awk '/^  [^ ]/ {print; next} /stalled/ {v = $NF + 0; if (v >= 0.3) print; next}
       /Duration|Throughput|Elapsed Cycles|Hit Rate|Warp Cycles Per|Issued Warp|No Eligible|Active Warps/ {print}' | head -50
