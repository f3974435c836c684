# limit: 60
# Device sampling and CUDA graphs of decode steps: their tests, then a short served load test on a random-weight
# model of Qwen3-30B-A3B shapes (zest serve --config qwen3-30b-a3b), text only, 64 words, 64 output tokens
# (ignore_eos), closed-loop clients, against servers of the same package:
#   before: ZEST_CUDA_GRAPHS=0 ZEST_DEVICE_SAMPLING=0 (eager steps, host logits, host sampling)
#   sampling: ZEST_CUDA_GRAPHS=0 (eager steps, sampling summaries on the device)
#   graphs: defaults (decode steps replayed from CUDA graphs, sampling summaries on the device)
# optionally with SERE (S=2, rho=0, random similarity). Greedy at 1, 8 and 32 clients; with run's SAMPLING=1 also
# top-k 50 at T=0.8 and pure temperature T=1 at 32 clients. GPU busy share (nvidia-smi utilization.gpu, 200 ms
# samples) during the greedy 32-client run.
set -u
"$P/test_cuda" --gtest_filter='SampleRows*:CudaGraph*:CudaVisionEngine.DevicePromptsMatchCpuAndHostRows' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'

CONFIG=${CONFIG:-qwen3-30b-a3b}
PORT=18090
SLOG=/tmp/zest-sample-serve.log
SERVER=
ROWS=()
health() {
  { exec 3<>"/dev/tcp/127.0.0.1/$PORT"; } 2>/dev/null || return 1
  printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  local line
  read -r -t 5 line <&3
  exec 3>&-
  [[ "$line" == *" 200"* ]]
}
stop_server() {
  if [ -n "$SERVER" ]; then
    kill "$SERVER" 2>/dev/null
    wait "$SERVER" 2>/dev/null
    SERVER=
  fi
}
bench() {  # LABEL CONCURRENCY REQUESTS [EXTRA_BODY]
  local row
  row=$(timeout 40 "$P/zest" bench serve --url "http://127.0.0.1:$PORT" --requests "$3" --concurrency "$2" \
    --prompt-len 64 --output-len 64 --seed "$2" --extra-body "${4:-{\}}" --table-row "$1" 2>&1 |
    grep -E '^\| |^first failure|^error')
  ROWS+=("${row:-| $1 | $2 | no result |}")
}
run() {  # LABEL SAMPLING(0/1) SERVER_FLAGS -- ENV...
  local label=$1 sampling=$2 flags=$3
  shift 4
  local t0=$(date +%s%N)
  env "$@" "$P/zest" serve --config "$CONFIG" --device cuda --port "$PORT" --max-num-seqs 32 --max-context 8192 \
    $flags >"$SLOG" 2>&1 &
  SERVER=$!
  local up=0
  for _ in $(seq 1 120); do
    if health; then up=1; break; fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.5
  done
  if [ $up = 0 ]; then
    echo "$label: server did not come up"
    tail -5 "$SLOG"
    stop_server
    return
  fi
  echo "$label: server up in $((($(date +%s%N) - t0) / 1000000)) ms ($* $flags)"
  bench warmup 8 8 >/dev/null
  unset 'ROWS[-1]'
  bench "$label" 1 3
  bench "$label" 8 16
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 >/tmp/zest-sample-util.txt 2>/dev/null &
  local smi=$!
  bench "$label" 32 64
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  echo "$label, 32 clients: GPU busy $(awk '{s += $1; n++} END {if (n) printf "%.0f%% (%d samples)", s / n, n}' /tmp/zest-sample-util.txt)"
  if [ "$sampling" = 1 ]; then
    bench "$label, top-k 50 T 0.8" 32 64 '{"temperature": 0.8, "top_k": 50}'
    bench "$label, T 1" 32 64 '{"temperature": 1.0}'
  fi
  grep -E "error|Error|graph" "$SLOG" | head -5
  stop_server
}
print_table() {
  echo
  echo "zest serve --config $CONFIG --device cuda (random weights), text only, 64 words, 64 output tokens (ignore_eos), greedy unless named"
  echo "| setup | clients | ok/requests | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | req/s | output tok/s |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo "total $SECONDS s"
}
trap 'stop_server; print_table' EXIT
# Final check of the package: before against graphs, greedy (earlier runs' rows are in BENCHMARKS.md).
run before 0 "" -- ZEST_CUDA_GRAPHS=0 ZEST_DEVICE_SAMPLING=0
run graphs 0 "" -- ZEST_CUDA_GRAPHS=1
