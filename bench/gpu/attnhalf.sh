# limit: 75
# L2 prefetches in the attention half of a decode layer (DecodeOption::kL2Prefetch, bench variant l2=N): the qkv
# GEMM prefetching the layer's KV rows, dealt round-robin over its CTAs (1: weight tiles evict-first, 2: plain), the
# ring decode attention prefetching the o GEMM's weights after its own copies (1, 3); small-M GEMM variants whose o
# GEMM CTAs fit beside the ring attention's: 8-row tiles for K > 2048 (gemm=5), register-streamed o GEMM (gemm=6), and
# the register-streamed qkv GEMM (gemm=7). Tests of the kernels involved, then TPOT at batch 1/4/8/16 (the options
# change nothing above 16 rows) in one process, with the in-graph per-op costs (--ablate) at batch 1 and 8 for l2=1;
# then Nsight Compute at batch 8, l2=1, kernels serialised without cache flushes: duration, DRAM bytes and L2 hit rate
# of the qkv GEMM, the attention and the o GEMM of two layers.
timeout 25 "$P/test_cuda" --gtest_filter='CudaLatencyGemm*:CudaDecodeAttention.FusedVariants*:CudaLatencyDecoder*' 2>&1 |
  grep --line-buffered -vE '^\[ +(RUN|OK) +\]'
echo "test_cuda exit: ${PIPESTATUS[0]}"
B="$P/bench_decode_bench"
timeout 46 "$B" --config qwen3-30b-a3b --batch 1,4,8,16 --context 1024 --steps 30 --warmup 5 \
  --ablate 1,8 --ablate-steps 8 --variant l2=1 --variant l2=0 --variant l2=2 --variant l2=3 --variant gemm=5 \
  --variant gemm=6 --variant gemm=7 --variant gemm=6,l2=2 2>&1 |
  grep --line-buffered -E 'variant|copy|^\| [0-9]|batch [0-9]+: TPOT|gemm |attention|router|experts|combine'
command -v ncu >/dev/null || { echo "ncu not found"; exit 0; }
echo "== ncu l2=1 batch 8 (serialised, no cache flush): us, DRAM MB read, L2 hit % =="
timeout 14 ncu --clock-control none --cache-control none --graph-profiling node -k 'regex:rows_pre|decode_attention' \
  --launch-skip 150 --launch-count 6 --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
  --csv --print-units base "$B" --config qwen3-30b-a3b --batch 8 --context 1024 --steps 2 --warmup 1 \
  --variant l2=1 2>/dev/null |
  python3 -c '
import csv, sys
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith("\""))]
if not rows: sys.exit(0)
hdr, rows = rows[0], rows[1:]
i = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = {}
for r in rows:
    key = (int(r[i["ID"]]), r[i["Kernel Name"]].split("(")[0].split("<")[0][-32:])
    k.setdefault(key, {})[r[i["Metric Name"]]] = r[i["Metric Value"]].replace(",", "")
for (id_, name), m in sorted(k.items()):
    d = float(m.get("gpu__time_duration.sum", 0)) / 1e3
    mb = float(m.get("dram__bytes_read.sum", 0)) / 1e6
    h = float(m.get("lts__t_sector_hit_rate.pct", 0))
    print(f"{id_:4d} {name:32s} {d:8.2f} us {mb:8.2f} MB  L2 hit {h:5.1f}%")
'
