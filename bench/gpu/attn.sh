# limit: 60
# Decode attention at Qwen3-30B-A3B shapes (32 query / 4 kv heads of 128, 16-token pages, context 1024, one H200):
# the decode attention tests (every fused variant against the host reference), then TPOT at batch 1/4/8/32/64 for
# attn=8 (the default: variant 3's cluster merge up to 8 (sequence, kv head) pairs, the bulk-copy ring kernel up to
# 32 pairs, variant 3 above; with the per-op cost inside the graph, --ablate), attn=3 (the previous default) and
# attn=5 (the ring kernel with the cluster merge at every size), then Nsight
# Compute durations of the decode attention kernel for attn=5 at batch 64 and attn=8 at batch 8 (kernels serialised,
# launches of replayed steps). Every step has its own time limit; output is line-buffered.
timeout 12 "$P/test_cuda" --gtest_filter='CudaDecodeAttention*:CudaLatencyAttention*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
B="$P/bench_decode_bench"
timeout 32 "$B" --config qwen3-30b-a3b --batch 1,4,8,32,64 --context 1024 --steps 30 --warmup 5 --ablate 8,64 \
  --ablate-steps 8 --variant attn=8 --variant attn=3 --variant attn=5 2>&1 |
  grep --line-buffered -vE '^sere_reroute|^\|---|^    (qk norm|decode attention  |router gemm|router top-k|moe plan)'
command -v ncu >/dev/null || { echo "ncu not found"; exit 0; }
for vb in "5 64" "8 8"; do
  set -- $vb
  echo "== ncu attn=$1 batch $2: decode attention launches of replayed steps (us, DRAM MB read, grid, cluster) =="
  timeout 7 ncu --clock-control none --graph-profiling node -k regex:decode_attention --launch-skip 100 \
    --launch-count 2 --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__cluster_dim_x \
    --csv --print-units base "$B" --config qwen3-30b-a3b --batch $2 --context 1024 --steps 2 --warmup 1 \
    --variant attn=$1 2>/dev/null |
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
