# limit: 120
# Where the batch-1 and batch-8 decode step goes (Qwen3-30B-A3B shapes, 48 layers, context 1024): GPU time per
# operation of one eager step (--profile), TPOT with and without programmatic dependent launch, and each kernel of
# one replayed layer under Nsight Compute (duration and DRAM bytes read, kernels serialised: the sum against TPOT
# per layer is the cost of the dependent chain). BENCH_ARGS adds options to every benchmark run (e.g. "--dtype fp8";
# with NCU_DETAIL="fp8_tile" NCU_BATCH=64: where the FP8 dense product's warps stall at 64 rows).
B="$P/bench_decode_bench"
[ -n "${NCU_ONLY:-}" ] || "$B" --config qwen3-30b-a3b --batch 1,8 --context 1024 ${BENCH_ARGS:-} --steps 30 --warmup 5 --profile 2>&1 | grep -v '^sere_reroute'
[ -n "${NCU_ONLY:-}" ] || "$B" --config qwen3-30b-a3b --batch 1,8 --context 1024 ${BENCH_ARGS:-} --steps 30 --warmup 5 --pdl 0 2>&1 | grep -E 'batch|TPOT|tpot'
if [ -n "${NCU_SOURCE:-}" ]; then
  # Per-instruction warp stall samples of one launch of each named kernel (regex) at batch NCU_BATCH: the hottest
  # SASS instructions in program order, with their share of all samples.
  for k in $NCU_SOURCE; do
    echo "== ncu source: $k, batch ${NCU_BATCH:-1} =="
    timeout ${NCU_TIMEOUT:-90} ncu --clock-control none --graph-profiling node -k "regex:$k" --launch-skip ${NCU_SKIP:-100} --launch-count 1 \
      --section SourceCounters --section WarpStateStats --sampling-interval "${NCU_SAMPLING:-auto}" --page source --print-source sass --csv \
      "$B" --config qwen3-30b-a3b --batch "${NCU_BATCH:-1}" --context 1024 ${BENCH_ARGS:-} --steps 2 --warmup 1 2>/dev/null |
      python3 -c '
import csv, sys
lines = [l for l in sys.stdin if l.startswith("\"")]
rows = [r for r in csv.reader(lines) if r and r[0] != "Kernel Name"]
hdr = rows[0]
def col(*names):
    for n in names:
        for j, h in enumerate(hdr):
            if h.startswith(n): return j
    return None
ja, js, jw = col("Address", "#"), col("Source"), col("Warp Stall Sampling (All", "Warp Stall Sampling", "stall")
if None in (ja, js, jw):
    print("columns:", hdr); [print(r[:8]) for r in rows[1:4]]; sys.exit(0)
body = [r for r in rows[1:] if len(r) == len(hdr)]
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
tot = sum(num(r[jw]) for r in body) or 1
print(f"{len(body)} instructions, {tot:.0f} samples; columns: {hdr[ja]}, {hdr[jw]}")
hot = sorted(range(len(body)), key=lambda i: -num(body[i][jw]))[:45]
for i in sorted(hot):
    r = body[i]
    print(f"{i:5d} {r[ja]:>8s} {100 * num(r[jw]) / tot:5.1f}% {r[js][:90]}")
'
  done
elif [ -n "${NCU_DETAIL:-}" ]; then
  # One launch of each named kernel (regex) at batch NCU_BATCH (default 1): where its warps stall.
  for k in $NCU_DETAIL; do
    echo "== ncu detail: $k, batch ${NCU_BATCH:-1} =="
    timeout ${NCU_TIMEOUT:-60} ncu --clock-control none --graph-profiling node -k "regex:$k" --launch-skip ${NCU_SKIP:-100} --launch-count 1 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      "$B" --config qwen3-30b-a3b --batch "${NCU_BATCH:-1}" --context 1024 ${BENCH_ARGS:-} --steps 2 --warmup 1 2>&1 |
      awk '/^  [^ ]/ {print; next} /stalled/ {v = $NF + 0; if (v >= 0.3) print; next}
           /Duration|Throughput|Elapsed Cycles|Registers|Shared Memory Config|Dynamic Shared|Grid Size|Block Size|Cluster|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per|Issued Warp|No Eligible|Active Warps/ {print}' | head -70
  done
elif command -v ncu >/dev/null; then
  # The context prefill's launches come first: 8 sequences' (8k tokens) fit in the 500 skipped, batch 64's (64k
  # tokens, ~300 matching launches per 8k) take a skip of 500 per 8 sequences (~2900 at 64), and more steps.
  # NCU_LAYER_SKIP sets the skip (FP8 prefill matches ~13 launches a layer, gemm_fp8_tc included: ~5000 at batch 64).
  for b in ${NCU_BATCHES:-1 8}; do
    echo "== ncu, batch $b: one layer of a replayed step (duration us, DRAM MB read) =="
    skip=${NCU_LAYER_SKIP:-$((b > 8 ? 500 + 300 * b / 8 : 500))}
    timeout ${NCU_TIMEOUT:-40} ncu --clock-control none --graph-profiling node -k regex:"rows_|decode_attention|moe_|norm_kernel|router|gemm_skinny|gemm_fp8|fp8_tile" --launch-skip $skip --launch-count ${NCU_COUNT:-16} \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__cluster_dim_x --csv --print-units base \
      "$B" --config qwen3-30b-a3b --batch $b --context 1024 ${BENCH_ARGS:-} --steps 6 --warmup 1 2>/dev/null |
      python3 -c '
import csv, sys
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith("\"")) ]
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
    print(f"{id_:4d} {name:40s} {d:8.2f} us {mb:8.2f} MB {mb / d / 1e3 if d else 0:6.2f} TB/s grid {g} cluster {c}")
'
  done
else
  echo "ncu not found"
fi
