#!/usr/bin/env bash
# Tests and benchmarks the CUDA vision tower + VisionZip on a GPU machine, in one command:
#   bench/gpu-vision.sh            build (or use prebuilt binaries), CudaVision* tests, memcheck, TTFT bench
# Environment:
#   ZEST_PREBUILT=FILE.tar.xz  a tarball holding test_cuda, bench_ttft_bench and lib/ (shared libraries the
#                              GPU machine may lack); used when its binaries run there, else CMake builds
#   ZEST_BENCH_ARGS="..."      extra arguments for the bench
#   OUT                        folder for logs (default /tmp/zest-gpu-vision)
# The CMake build links test_cuda with zest_vision and zest_accel (the vision tower and VisionZip tests
# compare with the CPU implementations) by patching this checkout's tests/CMakeLists.txt first.
set -u
cd "$(dirname "$0")/.."
OUTD=${OUT:-/tmp/zest-gpu-vision}
mkdir -p "$OUTD"
LOG="$OUTD/gpu-vision.log"
: >"$LOG"
note() { echo "== $*" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv 2>&1 | tee -a "$LOG"

TEST_BIN="" BENCH_BIN=""
if [ -n "${ZEST_PREBUILT:-}" ] && [ -f "$ZEST_PREBUILT" ]; then
  mkdir -p /tmp/zest-prebuilt && tar -xJf "$ZEST_PREBUILT" -C /tmp/zest-prebuilt
  export LD_LIBRARY_PATH=/tmp/zest-prebuilt/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  if /tmp/zest-prebuilt/test_cuda --gtest_list_tests >/dev/null 2>>"$LOG" &&
     /tmp/zest-prebuilt/bench_ttft_bench --help >/dev/null 2>>"$LOG"; then
    TEST_BIN=/tmp/zest-prebuilt/test_cuda BENCH_BIN=/tmp/zest-prebuilt/bench_ttft_bench
    note "using prebuilt binaries from $ZEST_PREBUILT"
  else
    note "prebuilt binaries do not run here (see log); building"
  fi
fi
if [ -z "$TEST_BIN" ]; then
  t0=$(date +%s)
  if cmake -S . -B build-gpu -DZEST_CUDA=ON -DZEST_TESTS=ON -DCMAKE_BUILD_TYPE=Release >>"$LOG" 2>&1 &&
     cmake --build build-gpu -j"${JOBS:-16}" --target test_cuda bench_ttft_bench >>"$LOG" 2>&1; then
    TEST_BIN=build-gpu/tests/test_cuda BENCH_BIN=build-gpu/bench/bench_ttft_bench
    note "cmake build: $(( $(date +%s) - t0 )) s"
  else
    note "cmake build failed:"
    grep -E "error|Error|Could not find" "$LOG" | head -20
    exit 1
  fi
fi

note "tests"
"$TEST_BIN" --gtest_filter='CudaVision*' 2>&1 | tee "$OUTD/test_vision.log" |
  grep -E "^\[  (FAILED|PASSED|SKIPPED|       OK) |Failure|Expected|Which is|max err|error" | head -60
if command -v compute-sanitizer >/dev/null 2>&1; then
  note "compute-sanitizer memcheck (vision kernels)"
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$TEST_BIN" \
    --gtest_filter='CudaVision.*:CudaVisionZip.Scores*' >"$OUTD/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -c 'Invalid' "$OUTD/memcheck.log") invalid accesses" | tee -a "$LOG"
  tail -3 "$OUTD/memcheck.log"
fi
note "bench"
timeout 300 "$BENCH_BIN" --config qwen3-vl-30b-a3b --images 1,8,30 --image-size 640x480 \
  --vision-prune-rate 0,0.3,0.4,0.5 ${ZEST_BENCH_ARGS:-} 2>&1 | tee "$OUTD/bench_uniform.log"
timeout 120 "$BENCH_BIN" --config qwen3-vl-30b-a3b --images 30 --image-size 640x480 \
  --vision-prune-rate 0,0.4 --mode global ${ZEST_BENCH_ARGS:-} 2>&1 | tee "$OUTD/bench_global.log"
