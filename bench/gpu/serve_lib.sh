# Shared by the served load tests (bench/gpu/serve.sh, graphs.sh, sample.sh): sourced, not run. The caller sets
# P (package dir), CONFIG, PORT, SLOG (server log) and optionally DEVICE (default cuda); rows of the result table
# collect in ROWS.
SERVER=
ROWS=()

health() {  # 0 when GET /health answers 200
  { exec 3<>"/dev/tcp/127.0.0.1/$PORT"; } 2>/dev/null || return 1
  printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  local line
  read -r -t 5 line <&3
  exec 3>&-
  [[ "$line" == *" 200"* ]]
}

# start_server [NAME=VALUE ...] [-- zest serve flags ...]: starts zest serve (environment NAME=VALUE) on $PORT with
# $CONFIG on $DEVICE, its output in $SLOG; returns 0 once /health answers, 1 (server stopped) when it does not.
start_server() {
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local t0
  t0=$(date +%s%N)
  env "${envs[@]}" "$P/zest" serve --config "$CONFIG" --device "${DEVICE:-cuda}" --port "$PORT" --max-num-seqs 32 \
    --max-context "${MAX_CONTEXT:-8192}" "$@" >"$SLOG" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 240); do
    if health; then
      echo "server up in $((($(date +%s%N) - t0) / 1000000)) ms: ${envs[*]} zest serve $*"
      return 0
    fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.5
  done
  echo "server did not come up (${envs[*]} $*):"
  tail -20 "$SLOG"
  stop_server
  return 1
}

stop_server() {
  if [ -n "$SERVER" ]; then
    kill "$SERVER" 2>/dev/null
    wait "$SERVER" 2>/dev/null
    SERVER=
  fi
}

# gpu_busy_start / gpu_busy_stop FILE: nvidia-smi utilisation samples every 200 ms; stop prints their mean.
gpu_busy_start() {
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 >"$1" 2>/dev/null &
  SMI=$!
}
gpu_busy_stop() {
  kill "$SMI" 2>/dev/null
  wait "$SMI" 2>/dev/null
  awk '{s += $1; n++} END {if (n) printf "%.0f%% (mean of %d samples every 200 ms)", s / n, n}' "$1"
}

print_table() {  # print_table TITLE
  echo
  echo "$1"
  echo "| setup | clients | ok/requests | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | req/s | output tok/s |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo "total $SECONDS s"
}
