# limit: 60
# Decode attention at Qwen3-30B-A3B shapes (32 query / 4 kv heads of 128, 16-token pages, context 1024, one H200):
# the decode attention tests, then TPOT at batch 8/32/64 for attn=9 (the bulk-copy ring kernel with two token rows
# per copy: half the copies of attn=5), attn=5 (one row per copy) and attn=8 (the default), then Nsight Compute
# durations of the ring kernel with two-row copies at batch 8 and 64 and where its warps stall at batch 64 (launch
# statistics, occupancy, warp states). The earlier comparison (batch 1/4/8/32/64, attn=8 / 3 / 5, with --ablate 8,64)
# was: bench_decode_bench --config qwen3-30b-a3b --batch 1,4,8,32,64 --context 1024 --steps 30 --warmup 5
#   --ablate 8,64 --ablate-steps 8 --variant attn=8 --variant attn=3 --variant attn=5
timeout 12 "$P/test_cuda" --gtest_filter='CudaDecodeAttention*:CudaLatencyAttention*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
B="$P/bench_decode_bench"
timeout 20 "$B" --config qwen3-30b-a3b --batch 8,32,64 --context 1024 --steps 30 --warmup 5 \
  --variant attn=9 --variant attn=5 --variant attn=8 2>&1 | grep --line-buffered -vE '^sere_reroute|^\|---'
command -v ncu >/dev/null || { echo "ncu not found"; exit 0; }
for b in 64 8; do
  echo "== ncu attn=9 batch $b: decode attention launches of replayed steps (us, DRAM MB read, grid, cluster) =="
  timeout 7 ncu --clock-control none --graph-profiling node -k regex:decode_attention --launch-skip 100 \
    --launch-count 2 --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__cluster_dim_x \
    --csv --print-units base "$B" --config qwen3-30b-a3b --batch $b --context 1024 --steps 2 --warmup 1 \
    --variant attn=9 2>/dev/null |
    python3 -c '
import csv, sys
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith("\""))]
if not rows: sys.exit(0)
hdr, rows = rows[0], rows[1:]
i = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = {}
for r in rows:
    key = (int(r[i["ID"]]), r[i["Kernel Name"]].split("(")[0].split("<")[0][-40:])
    k.setdefault(key, {})[r[i["Metric Name"]]] = r[i["Metric Value"]].replace(",", "")
for (id_, name), m in sorted(k.items()):
    d = float(m.get("gpu__time_duration.sum", 0)) / 1e3
    mb = float(m.get("dram__bytes_read.sum", 0)) / 1e6
    g = m.get("launch__grid_size", "?"); c = m.get("launch__cluster_dim_x", "?")
    print(f"{id_:4d} {name:40s} {d:8.2f} us {mb:8.2f} MB {mb / d if d else 0:6.2f} TB/s grid {g} cluster {c}")
'
done
echo "== ncu detail: attn=5 (decode_attention_ring, one row per copy), batch 64 =="
timeout 15 ncu --clock-control none --graph-profiling node -k "regex:decode_attention_ring" --launch-skip 100 \
  --launch-count 1 --section LaunchStats --section Occupancy --section WarpStateStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$B" --config qwen3-30b-a3b --batch 64 --context 1024 --steps 2 --warmup 1 --variant attn=5 2>&1 |
  awk '/stalled/ {v = $NF + 0; if (v >= 0.3) print; next}
       /Duration|Registers|Dynamic Shared|Grid Size|Block Size|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per|Issued Warp|No Eligible|Active Warps/ {print}' | head -40
