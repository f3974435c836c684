# limit: 60
# Device sampling and CUDA graphs of decode steps: their tests, then a short served load test on a random-weight
# model of Qwen3-30B-A3B shapes (zest serve --config qwen3-30b-a3b), text only, 64 words, 64 output tokens
# (ignore_eos), closed-loop clients, against servers of the same package:
#   before: zest serve --cuda-graphs off --host-sampling (eager steps, host logits, host sampling)
#   sampling: --cuda-graphs off (eager steps, sampling summaries on the device)
#   graphs: defaults (decode steps replayed from CUDA graphs, sampling summaries on the device)
# optionally with SERE (S=2, rho=0, random similarity). Greedy at 1, 8 and 32 clients; with run's SAMPLING=1 also
# top-k 50 at T=0.8 and pure temperature T=1 at 32 clients. GPU busy share (nvidia-smi utilization.gpu, 200 ms
# samples) during the greedy 32-client run.
set -u
"$P/test_cuda" --gtest_filter='SampleRows*:CudaGraph*:CudaVisionEngine.DevicePromptsMatchCpuAndHostRows' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'

CONFIG=${CONFIG:-qwen3-30b-a3b}
PORT=18090
SLOG=/tmp/zest-sample-serve.log
. "$(dirname "$0")/serve_lib.sh"
bench() {  # LABEL CONCURRENCY REQUESTS [EXTRA_BODY]
  local row
  row=$(timeout 40 "$P/zest" bench serve --url "http://127.0.0.1:$PORT" --requests "$3" --concurrency "$2" \
    --prompt-len 64 --output-len 64 --seed "$2" --extra-body "${4:-{\}}" --table-row "$1" 2>&1 |
    grep -E '^\| |^first failure|^error')
  ROWS+=("${row:-| $1 | $2 | no result |}")
}
run() {  # LABEL SAMPLING(0/1) SERVER_FLAGS
  local label=$1 sampling=$2 flags=$3
  echo -n "$label: "
  start_server -- $flags || return
  bench warmup 8 8 >/dev/null
  unset 'ROWS[-1]'
  bench "$label" 1 3
  bench "$label" 8 16
  gpu_busy_start /tmp/zest-sample-util.txt
  bench "$label" 32 64
  echo "$label, 32 clients: GPU busy $(gpu_busy_stop /tmp/zest-sample-util.txt)"
  if [ "$sampling" = 1 ]; then
    bench "$label, top-k 50 T 0.8" 32 64 '{"temperature": 0.8, "top_k": 50}'
    bench "$label, T 1" 32 64 '{"temperature": 1.0}'
  fi
  grep -E "error|Error|graph" "$SLOG" | head -5
  stop_server
}
trap 'stop_server; print_table "zest serve --config $CONFIG --device ${DEVICE:-cuda} (random weights), text only, 64 words, 64 output tokens (ignore_eos), greedy unless named"' EXIT
# Final check of the package: before against graphs, greedy (what the earlier runs gave: docs/perf-history.md).
run before 0 "--cuda-graphs off --host-sampling"
run graphs 0 ""
