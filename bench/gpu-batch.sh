#!/usr/bin/env bash
# Run on the GPU machine with the package from bench/gpu-package.sh carried (.gpu/zest-gpu.tar.xz): unpacks it,
# then runs each job script given as an argument (bench/gpu/<name>.sh; a "# limit: SECONDS" line sets its time
# limit, default 60; ZEST_JOB_CAP caps every limit) with P = the unpacked package (test_cuda, bench_*, zest, lib/). Each job's output goes
# to $OUT/<name>.log; a summary line per job is printed last.
set -u
cd "$(dirname "$0")/.."
OUTD=${OUT:-/tmp/zest-gpu-batch}
mkdir -p "$OUTD"
PKG=${ZEST_PKG:-.gpu/zest-gpu.tar.xz}
rm -rf /tmp/zest-pkg && mkdir -p /tmp/zest-pkg && tar -xJf "$PKG" -C /tmp/zest-pkg || exit 1
export P=/tmp/zest-pkg/pkg
SRC=$(cat "$P/source_dir")
if [ "$SRC" != "$PWD" ] && [ ! -e "$SRC" ]; then mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; fi
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
echo "package commit: $(cat "$P/commit" 2>/dev/null)"
summary=()
for job in "$@"; do
  name=$(basename "$job" .sh)
  limit=$(sed -n 's/^# limit: *\([0-9][0-9]*\).*/\1/p' "$job" | head -1)
  limit=${limit:-60}
  if [ -n "${ZEST_JOB_CAP:-}" ] && [ "$limit" -gt "$ZEST_JOB_CAP" ]; then limit=$ZEST_JOB_CAP; fi
  start=$(date +%s)
  timeout "$limit" bash "$job" >"$OUTD/$name.log" 2>&1
  rc=$?
  summary+=("$name: rc=$rc $(($(date +%s) - start)) s (limit $limit)")
done
echo "================ jobs ================"
for s in "${summary[@]}"; do echo "$s"; done
