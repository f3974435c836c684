#!/usr/bin/env bash
# Run on the GPU machine with the package from bench/gpu-package.sh (carry .gpu): the CUDA tests, a
# compute-sanitizer memcheck pass, the decode benchmark (Qwen3-30B-A3B shapes, with and without SERE)
# and the multi-image TTFT benchmark (Qwen3-VL-30B-A3B shapes, with and without VisionZip); prints a
# short summary last. Logs go to $OUT (default /tmp/zest-gpu-check). MEMCHECK=0 skips the sanitizer pass.
set -u
cd "$(dirname "$0")/.."
OUTD=${OUT:-/tmp/zest-gpu-check}
mkdir -p "$OUTD"
PKG=${ZEST_PKG:-.gpu/zest-gpu.tar.xz}
rm -rf /tmp/zest-pkg && mkdir -p /tmp/zest-pkg && tar -xJf "$PKG" -C /tmp/zest-pkg || exit 1
P=/tmp/zest-pkg/pkg
SRC=$(cat "$P/source_dir")
if [ "$SRC" != "$PWD" ] && [ ! -e "$SRC" ]; then mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; fi
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
summary=()
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUTD/gpu.txt"

echo "== tests"
timeout 180 "$P/test_cuda" >"$OUTD/test_cuda.log" 2>&1
summary+=("test_cuda: rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+' "$OUTD/test_cuda.log" | tr '\n' ' ')")
grep -E "^\[  FAILED|Failure" -A3 "$OUTD/test_cuda.log" | head -30

if [ "${MEMCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
  echo "== memcheck"
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 "$P/test_cuda" \
    --gtest_filter='-*Synthetic*:*LongContext*:*Fixture*:*HeadDim128*:*MatchesCpuTower*' >"$OUTD/memcheck.log" 2>&1
  summary+=("memcheck: rc=$? $(grep 'ERROR SUMMARY' "$OUTD/memcheck.log" | tail -1)")
fi

echo "== decode"
timeout 150 "$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 \
  --sere-primary 2 --sere-threshold 0 --pdl 1 >"$OUTD/decode.log" 2>&1
summary+=("decode bench: rc=$?")
echo "== ttft"
timeout 150 "$P/bench_ttft_bench" --config qwen3-vl-30b-a3b --images 1,8,30 --image-size 640x480 \
  --vision-prune-rate 0,0.4 >"$OUTD/ttft.log" 2>&1
summary+=("ttft bench: rc=$?")
echo "== prefill"; timeout 200 "$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 512,2048,8192 --layers 2 >"$OUTD/prefill.log" 2>&1; summary+=("prefill bench: rc=$?")

echo
echo "================ summary ================"
for s in "${summary[@]}"; do echo "$s"; done
echo "--- decode"
grep -E "^\||^SERE|^sere_reroute|copy bandwidth|^error" "$OUTD/decode.log"
echo "--- ttft"
grep -E "^\||^error|MFU|estimate" "$OUTD/ttft.log" | head -40
