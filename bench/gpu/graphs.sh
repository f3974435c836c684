# limit: 60
# Padded decode graphs (ZEST_CUDA_GRAPH_PAD): a short served load test on a random-weight model
# of Qwen3-30B-A3B shapes (zest serve --config qwen3-30b-a3b), text only, 64 words, 64 output tokens (ignore_eos),
# greedy, closed-loop clients, 8 and 32 at a time, then 60 requests arriving as a Poisson process of 20/s (the batch
# size changes nearly every step), against two servers of the same package: padding on (the default) and off
# (ZEST_CUDA_GRAPH_PAD=0). Graphs captured per server (ZEST_CUDA_GRAPH_LOG=1 lines, warmup included).
# The padded graph tests (CudaGraph.Padded*) run with the whole CUDA suite.
set -u

CONFIG=${CONFIG:-qwen3-30b-a3b}
PORT=18091
SLOG=/tmp/zest-graphs-serve.log
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
bench() {  # LABEL CONCURRENCY REQUESTS [RATE]
  local row
  row=$(timeout 30 "$P/zest" bench serve --url "http://127.0.0.1:$PORT" --requests "$3" --concurrency "$2" \
    --rate "${4:-0}" --prompt-len 64 --output-len 64 --seed "$2" --table-row "$1" 2>&1 |
    grep -E '^\| |^first failure|^error')
  ROWS+=("${row:-| $1 | $2 | no result |}")
  echo "${ROWS[-1]}"
}
run() {  # LABEL -- ENV...
  local label=$1
  shift 2
  local t0=$(date +%s%N)
  env ZEST_CUDA_GRAPH_LOG=1 "$@" "$P/zest" serve --config "$CONFIG" --device cuda --port "$PORT" --max-num-seqs 32 \
    --max-context 8192 >"$SLOG" 2>&1 &
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
  echo "$label: graphs captured after warmup: $(grep -c 'decode graph captured' "$SLOG")"
  bench "$label" 8 16
  echo "$label: graphs captured after 8 clients: $(grep -c 'decode graph captured' "$SLOG")"
  bench "$label" 32 64
  echo "$label: graphs captured after 32 clients: $(grep -c 'decode graph captured' "$SLOG")"
  bench "$label, Poisson 20/s" 0 60 20
  echo "$label: graphs captured after Poisson arrivals: $(grep -c 'decode graph captured' "$SLOG")"
  grep 'decode graph captured' "$SLOG" | awk '{print $5}' | sort -n | uniq -c | tr '\n' ' ' | sed 's/^/  captures by rows: /'
  echo
  grep -E "error|Error|failed" "$SLOG" | head -5
  stop_server
}
print_table() {
  echo
  echo "zest serve --config $CONFIG --device cuda (random weights), text only, 64 words, 64 output tokens (ignore_eos), greedy"
  echo "| setup | clients | ok/requests | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | req/s | output tok/s |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo "total $SECONDS s"
}
trap 'stop_server; print_table' EXIT
run "pad on" -- ZEST_CUDA_GRAPH_PAD=1
run "pad off" -- ZEST_CUDA_GRAPH_PAD=0
