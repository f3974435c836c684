# limit: 90
# Device sampling and CUDA graphs of decode steps: their tests, then a short served load test on a random-weight
# model of Qwen3-30B-A3B shapes (zest serve --config qwen3-30b-a3b), text only, greedy, 64 output tokens, at 1 and
# 32 closed-loop clients, against three servers of the same package:
#   before:   ZEST_CUDA_GRAPHS=0 ZEST_DEVICE_SAMPLING=0 (eager steps, host logits, host sampling)
#   sampling: ZEST_CUDA_GRAPHS=0 (eager steps, sampling summaries on the device)
#   graphs:   defaults (decode steps replayed from CUDA graphs, sampling on the device)
# GPU busy share (nvidia-smi utilization.gpu, 200 ms samples) during each 32-client run.
set -u
"$P/test_cuda" --gtest_filter='SampleRows*:CudaGraph*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'

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
bench() {  # LABEL CONCURRENCY REQUESTS
  local row
  row=$(timeout 40 "$P/zest" bench serve --url "http://127.0.0.1:$PORT" --requests "$3" --concurrency "$2" \
    --prompt-len 64 --output-len 64 --seed "$2" --table-row "$1" 2>&1 | grep -E '^\| |^first failure|^error')
  ROWS+=("${row:-| $1 | $2 | no result |}")
}
run() {  # LABEL ENV...
  local label=$1
  shift
  local t0=$(date +%s%N)
  env "$@" "$P/zest" serve --config "$CONFIG" --device cuda --port "$PORT" --max-num-seqs 32 --max-context 8192 \
    >"$SLOG" 2>&1 &
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
  echo "$label: server up in $((($(date +%s%N) - t0) / 1000000)) ms ($*)"
  bench warmup 8 8 >/dev/null
  unset 'ROWS[-1]'
  bench "$label" 1 3
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 >/tmp/zest-sample-util.txt 2>/dev/null &
  local smi=$!
  bench "$label" 32 64
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  echo "$label, 32 clients: GPU busy $(awk '{s += $1; n++} END {if (n) printf "%.0f%% (%d samples)", s / n, n}' /tmp/zest-sample-util.txt)"
  grep -E "error|Error|graph" "$SLOG" | head -5
  stop_server
}
print_table() {
  echo
  echo "zest serve --config $CONFIG --device cuda (random weights), text only, 64 words, 64 output tokens, greedy"
  echo "| setup | clients | ok/requests | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | req/s | output tok/s |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo "total $SECONDS s"
}
trap 'stop_server; print_table' EXIT
run before ZEST_CUDA_GRAPHS=0 ZEST_DEVICE_SAMPLING=0
run graphs ZEST_CUDA_GRAPHS=1
run sampling ZEST_CUDA_GRAPHS=0
