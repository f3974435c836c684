#!/usr/bin/env bash
# One call on the GPU machine, with the package from bench/gpu-package.sh carried (.gpu/zest-gpu.tar.xz; run
# `bash bench/lighten.sh off demo` before the call and `bash bench/lighten.sh on` after, for the 64 MiB limit): the CUDA
# test suite, a compute-sanitizer memcheck pass over it (MEMCHECK=0 skips), the decode benchmark (Qwen3-30B-A3B
# shapes, SERE off/on; bf16, then FP8 weights), the FP8 paths' off forms (fp8-paths), the prefill benchmark, the
# multi-image TTFT benchmark (Qwen3-VL-30B-A3B shapes, VisionZip rates), SERE calibration on the CUDA decoder, served
# decode steps against the decoder's own (bench/gpu/servegap.sh), with SERVE=1 the zest serve load test (bench/gpu/serve.sh), and with RACECHECK=1 compute-sanitizer racecheck over
# the cluster kernels' tests (bench/gpu/racecheck.sh; several minutes).
# MEMCHECK=only runs the memcheck pass alone (so that a long sanitizer run gets a call of its own); ONLY="names" keeps
# the jobs named (tests, memcheck, decode, decode-fp8, fp8-paths, prefill, ttft, sere, servegap, serve, racecheck).
# Each step is a job of bench/gpu-batch.sh with its own time limit; logs go to $OUT (default /tmp/zest-gpu-batch).
# A short summary is printed last.
set -u
cd "$(dirname "$0")/.."
J=/tmp/zest-check-jobs
rm -rf "$J" && mkdir -p "$J"
cat >"$J/memcheck.sh" <<'JOB'
# limit: 240
# The suite without its long benchmark-sized cases (5000-token contexts, fixtures
# run end to end), which take minutes under the sanitizer, and without the tests of kernels running side by side
# (the sanitizer serialises launches, so a kernel that waits for another one to run beside it cannot finish).
compute-sanitizer --tool memcheck --error-exitcode 3 "$P/test_cuda" \
  --gtest_filter='-*LongContext*:*Fixture*:*HeadDim128*:*MatchesCpuTower*:*CalibrationOnCudaDecoder*:*AnotherKernelLeaves*:*OnTwoStreams*' 2>&1 \
  | grep -E 'ERROR SUMMARY|PASSED|FAILED|Invalid|out of bounds' | head -20
JOB
cat >"$J/decode.sh" <<'JOB'
# limit: 180
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0
JOB
cat >"$J/decode-fp8.sh" <<'JOB'
# limit: 180
# The same shapes with block-wise FP8 weights kept in FP8 (issue 42's bar compares them with the bf16 job above).
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --dtype fp8 --sere-primary 2 --sere-threshold 0
JOB
cat >"$J/fp8-paths.sh" <<'JOB'
# limit: 300
# The FP8 paths of DeviceDecodeOptions against their off forms in the same job: decode experts through the per-tile
# kernel instead of the streaming one, prefill through bf16 copies of the weights instead of FP8 tensor cores (the
# default FP8 prefill, with the card's cuBLASLt FP8 peak, is the prefill job's last run); then the per-op layer.
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --dtype fp8 --fp8-stream-experts 0
"$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 2048,8192 --dtype fp8 --fp8-tensor-cores 0
"$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 8192 --ops --runs 5
JOB
cat >"$J/prefill.sh" <<'JOB'
# limit: 240
# The SM clock sampled every 100 ms meanwhile: a whole-model 8k prefill holds the GPU's power limit, which lowers it.
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 >/tmp/zest-prefill-clocks.txt 2>&1 &
smi=$!
"$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 512,2048,8192
kill "$smi" 2>/dev/null
"$P/bench_prefill_bench" --config qwen3-30b-a3b --tokens 2048,8192 --dtype fp8
# Samples under load (power above 400 W): SM clock min / median / max, MHz.
awk -F', *' '$2 + 0 > 400 {print $1 + 0}' /tmp/zest-prefill-clocks.txt | sort -n |
  awk '{v[NR] = $1} END {if (NR) printf "SM clock under load (%d samples, power > 400 W): min %d / median %d / max %d MHz\n", NR, v[1], v[int((NR + 1) / 2)], v[NR]}'
JOB
cat >"$J/ttft.sh" <<'JOB'
# limit: 90
"$P/bench_ttft_bench" --config qwen3-vl-30b-a3b --images 1,8,30 --image-size 640x480 --vision-prune-rate 0,0.3,0.4,0.5
JOB
cat >"$J/sere.sh" <<'JOB'
# limit: 60
start=$(date +%s%N)
"$P/zest" calibrate-sere --config qwen3-30b-a3b --device cuda --tokens 2048 --out /tmp/sere_sim.safetensors 2>&1 | tr '\r' '\n' | tail -3
echo "calibrate-sere wall: $((($(date +%s%N) - start) / 1000000)) ms (model synthesis and upload included)"
JOB
jobs=(bench/gpu/tests.sh)  # the suite, with a hang named by cuda-gdb
[ "${MEMCHECK:-1}" = 1 ] && jobs+=("$J/memcheck.sh")
jobs+=("$J/decode.sh" "$J/decode-fp8.sh" "$J/fp8-paths.sh" "$J/prefill.sh" "$J/ttft.sh" "$J/sere.sh" bench/gpu/servegap.sh)
[ "${MEMCHECK:-1}" = only ] && jobs=("$J/memcheck.sh")
[ "${SERVE:-0}" = 1 ] && jobs+=(bench/gpu/serve.sh)
[ "${RACECHECK:-0}" = 1 ] && jobs+=(bench/gpu/racecheck.sh)
# ONLY="tests decode decode-fp8" keeps those jobs (a call is limited to 600 s; the whole check takes about ten minutes).
if [ -n "${ONLY:-}" ]; then
  kept=()
  for j in "${jobs[@]}"; do
    case " $ONLY " in *" $(basename "$j" .sh) "*) kept+=("$j") ;; esac
  done
  jobs=("${kept[@]}")
fi
bash bench/gpu-batch.sh "${jobs[@]}"
L=${OUT:-/tmp/zest-gpu-batch}
echo "================ summary ================"
[ -e "$L/tests.log" ] && grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED \] [0-9]+|^no progress' "$L/tests.log"
[ -e "$L/memcheck.log" ] && grep -E 'ERROR SUMMARY' "$L/memcheck.log" | tail -1
if [ -e "$L/decode.log" ]; then
  echo "--- decode"; grep -E '^\||^SERE at|^sere_reroute|copy bandwidth' "$L/decode.log"
  echo "--- fp8 paths"; grep -E '^\||^SERE at|^T=' "$L/fp8-paths.log"
  echo "--- prefill"; grep -E '^\||^SM clock|^FP8 tensor-core peak' "$L/prefill.log"
  echo "--- ttft"; grep -E '^\|' "$L/ttft.log" | head -20
  echo "--- sere calibration"; cat "$L/sere.log"
fi
if [ -e "$L/servegap.log" ]; then
  echo "--- served decode steps against the decoder's own (context 256)"
  grep -E '^\||batch [0-9]: TPOT|engine per decode step' "$L/servegap.log"
fi
[ -e "$L/serve.log" ] && { echo "--- serve"; grep -E '^\|' "$L/serve.log"; }
[ -e "$L/racecheck.log" ] && { echo "--- racecheck"; grep -E '^==|SUMMARY|^ +[0-9]+ ' "$L/racecheck.log"; }
true
