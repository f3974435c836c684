# limit: 60
# Decode attention at Qwen3-30B-A3B shapes (32 query / 4 kv heads of 128, 16-token pages, context 1024, one H200):
# the decode attention tests, then where the warps of one decode attention launch stall at batch 64 (Nsight
# Compute: launch statistics, occupancy, warp states) for the bulk-copy ring kernel (attn=5) and the previous
# default's kernel (attn=3). The TPOT comparison of the last runs was:
#   bench_decode_bench --config qwen3-30b-a3b --batch 1,4,8,32,64 --context 1024 --steps 30 --warmup 5
#     --ablate 8,64 --ablate-steps 8 --variant attn=8 --variant attn=3 --variant attn=5
timeout 12 "$P/test_cuda" --gtest_filter='CudaDecodeAttention*:CudaLatencyAttention*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
B="$P/bench_decode_bench"
command -v ncu >/dev/null || { echo "ncu not found"; exit 0; }
for vk in "5 decode_attention_ring" "3 decode_attention_fused"; do
  set -- $vk
  echo "== ncu detail: attn=$1 ($2), batch 64 =="
  timeout 20 ncu --clock-control none --graph-profiling node -k "regex:$2" --launch-skip 100 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    "$B" --config qwen3-30b-a3b --batch 64 --context 1024 --steps 2 --warmup 1 --variant attn=$1 2>&1 |
    awk '/^  [^ ]/ {print; next} /stalled/ {v = $NF + 0; if (v >= 0.3) print; next}
         /Duration|Throughput|Registers|Dynamic Shared|Grid Size|Block Size|Cluster|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per|Issued Warp|No Eligible|Active Warps/ {print}' | head -60
done
