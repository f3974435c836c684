#!/usr/bin/env bash
# Builds and checks the CUDA backend on a GPU machine, then runs the decode benchmarks and prints a summary.
#   bench/gpu-check.sh            build (CMake, else a direct nvcc/g++ build), test, memcheck, benchmark
# Environment:
#   ZEST_PREBUILT=DIR   use DIR/test_cuda and DIR/bench_decode_bench if they run here (skips the build)
#   ZEST_THIRD_PARTY=DIR  GoogleTest sources (DIR/googletest) and CLI11 headers (DIR/include) for the direct build
#   ZEST_BENCH_ARGS="..." extra arguments for every benchmark run
#   OUT                 folder for logs (default /tmp/zest-gpu-check)
set -u
cd "$(dirname "$0")/.."
OUTD=${OUT:-/tmp/zest-gpu-check}
mkdir -p "$OUTD"
LOG="$OUTD/gpu-check.log"
: >"$LOG"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
JOBS=${JOBS:-16}
summary=()
note() { echo "== $*" | tee -a "$LOG"; }

note "$(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv 2>&1 | tee -a "$LOG"

TEST_BIN="" BENCH_BIN=""
export LD_LIBRARY_PATH="$CUDA_HOME/lib64:$CUDA_HOME/lib:${LD_LIBRARY_PATH:-}"
if [ -n "${ZEST_PREBUILT:-}" ] && "$ZEST_PREBUILT/test_cuda" --gtest_list_tests >/dev/null 2>&1 &&
   "$ZEST_PREBUILT/bench_decode_bench" --help >/dev/null 2>&1; then
  TEST_BIN="$ZEST_PREBUILT/test_cuda" BENCH_BIN="$ZEST_PREBUILT/bench_decode_bench"
  note "using prebuilt binaries from $ZEST_PREBUILT"
  summary+=("build: prebuilt binaries")
fi

if [ -z "$TEST_BIN" ]; then
  note "cmake configure"
  t0=$(date +%s)
  if cmake -S . -B build-gpu -DZEST_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
       -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 \
       >>"$LOG" 2>&1 && cmake --build build-gpu -j"$JOBS" --target test_cuda >>"$LOG" 2>&1; then
    TEST_BIN=build-gpu/tests/test_cuda
    if cmake --build build-gpu -j"$JOBS" --target bench_decode_bench >>"$LOG" 2>&1; then
      BENCH_BIN=build-gpu/bench/bench_decode_bench
    fi
    summary+=("build: cmake ($(( $(date +%s) - t0 )) s)")
  else
    note "cmake build failed (see log); falling back to a direct nvcc/g++ build"
    tail -20 "$LOG"
  fi
fi

# Direct build: the CUDA library, zest_core, GoogleTest and the two programs, without CMake.
if [ -z "$TEST_BIN" ] || [ -z "$BENCH_BIN" ]; then
  t0=$(date +%s)
  TP=${ZEST_THIRD_PARTY:-.gpu/third_party}
  B=build-gpu-direct
  mkdir -p $B/obj
  CXXF="-std=c++20 -O2 -DNDEBUG -DZEST_HAVE_CUDA=1 -Isrc -Itests -I$CUDA_HOME/include -I$TP/include"
  NVF="-std=c++20 -O3 -DNDEBUG -DZEST_HAVE_CUDA=1 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Isrc"
  GT="$TP/googletest"
  {
    for f in src/kernels/cuda/*.cu; do echo "$NVCC $NVF -c $f -o $B/obj/$(basename "$f").o"; done
    for f in src/kernels/cuda/*.cpp src/core/*.cpp; do echo "g++ $CXXF -c $f -o $B/obj/$(basename "$f").o"; done
    echo "g++ -std=c++20 -O2 -I$GT/include -I$GT -c $GT/src/gtest-all.cc -o $B/gtest-all.o"
    echo "g++ -std=c++20 -O2 -I$GT/include -I$GT -c $GT/src/gtest_main.cc -o $B/gtest_main.o"
  } | xargs -P "$JOBS" -I{} sh -c '{} >>'"$LOG"' 2>&1 || echo "FAILED: {}" | tee -a '"$LOG"
  LIBS="-L$CUDA_HOME/lib64 -L$CUDA_HOME/lib -lcublasLt -lcublas -lcudart -lpthread -ldl"
  if [ -z "$TEST_BIN" ] && g++ $CXXF -I$GT/include tests/cuda/*.cpp $B/obj/*.o $B/gtest-all.o $B/gtest_main.o $LIBS \
       -o $B/test_cuda >>"$LOG" 2>&1; then
    TEST_BIN=$B/test_cuda
  fi
  if [ -z "$BENCH_BIN" ] && g++ $CXXF bench/decode_bench.cpp $B/obj/*.o $LIBS -o $B/bench_decode_bench >>"$LOG" 2>&1; then
    BENCH_BIN=$B/bench_decode_bench
  fi
  summary+=("build: direct nvcc/g++ ($(( $(date +%s) - t0 )) s)")
fi

if [ -n "$TEST_BIN" ]; then
  note "tests: $TEST_BIN"
  "$TEST_BIN" 2>&1 | tee "$OUTD/test_cuda.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error|Expected|Which is|max err" | head -60
  summary+=("tests: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$OUTD/test_cuda.log" | tr '\n' ' ')")
  if command -v compute-sanitizer >/dev/null 2>&1; then
    note "compute-sanitizer memcheck"
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$TEST_BIN" --gtest_filter='-*Synthetic*:*LongContext*' \
      >"$OUTD/memcheck.log" 2>&1
    rc=$?
    tail -4 "$OUTD/memcheck.log"
    summary+=("memcheck: rc=$rc, $(grep 'ERROR SUMMARY' "$OUTD/memcheck.log" | tail -1)")
  fi
else
  summary+=("tests: NOT BUILT (see $LOG)")
fi

if [ -n "$BENCH_BIN" ]; then
  run_bench() {
    local name=$1
    shift
    note "bench $name: $BENCH_BIN $* ${ZEST_BENCH_ARGS:-}"
    timeout 200 "$BENCH_BIN" "$@" ${ZEST_BENCH_ARGS:-} 2>&1 | tee "$OUTD/bench_$name.log"
  }
  run_bench main --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 --pdl 1
  run_bench profile --config qwen3-30b-a3b --batch 1,8,64 --context 1024 --pdl 0 --steps 50 --profile
  run_bench skew --config qwen3-30b-a3b --batch 8,32,64 --context 1024 --skew 1.0 --sere-primary 2 --pdl 1 --steps 100
else
  summary+=("bench: NOT BUILT (see $LOG)")
fi

echo
echo "================ summary ================"
for s in "${summary[@]}"; do echo "$s"; done
for f in "$OUTD"/bench_*.log; do
  [ -f "$f" ] || continue
  echo "--- $(basename "$f" .log)"
  grep -E "^\||^SERE|^sere_reroute|copy bandwidth|^error|^    " "$f"
done
