# limit: 460
# Where issue 42's FP8 decode step spends its time (one GPU; package from bench/gpu-package.sh): each kernel of one
# replayed decode layer at batch 1 and 64 (ncu, serialised: duration and DRAM bytes; batch 8's is in BENCHMARKS.md).
# Then the prefill GEMM (below).
# At batch 64 the FP8 context prefill (8 chunks of 8k tokens, ~13 matching launches a layer with the tensor-core GEMMs)
# comes first: skipped (~5000 launches).
NCU_ONLY=1 NCU_BATCHES="1" NCU_TIMEOUT=100 NCU_COUNT=12 BENCH_ARGS="--dtype fp8" timeout 110 bash bench/gpu/profile.sh
NCU_ONLY=1 NCU_BATCHES="64" NCU_LAYER_SKIP=6500 NCU_TIMEOUT=170 NCU_COUNT=24 BENCH_ARGS="--dtype fp8" timeout 180 \
  bash bench/gpu/profile.sh
# The FP8 tensor-core GEMM in prefill (bench_prefill_bench --ops at 8k, without --dtype fp8: the FP8 kernels run among
# its "other paths", three launches each: qkv, o, the experts' gate/up and down, the dense 8192^3 case): throughput,
# tensor-pipe activity, L2 bytes and where the warps stall, per launch.
timeout 150 ncu --clock-control none -k regex:gemm_fp8_tc --launch-count 13 --section SpeedOfLight --section WarpStateStats \
  --metrics "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__bytes_read.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --ops --runs 1 2>&1 |
  awk '/gemm_fp8_tc_kernel/ {print; next} /stalled/ {v = $NF + 0; if (v >= 0.2) print; next}
       /Duration|Throughput|gmma|lts__t_bytes|dram__bytes|Grid Size|Warp Cycles Per|Issued Warp|No Eligible|Active Warps/ {print}' | head -220
