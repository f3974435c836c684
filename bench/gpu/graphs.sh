# limit: 60
# Padded decode graphs (zest serve's graph padding): a short served load test on a random-weight model
# of Qwen3-30B-A3B shapes (zest serve --config qwen3-30b-a3b), text only, 64 words, 64 output tokens (ignore_eos),
# greedy, closed-loop clients, 8 and 32 at a time, then 60 requests arriving as a Poisson process of 20/s (the batch
# size changes nearly every step), against two servers of the same package: padding on (the default) and off
# (--no-cuda-graph-padding). Graphs captured per server (--cuda-graph-log lines, warmup included).
# The padded graph tests (CudaGraph.Padded*) run with the whole CUDA suite.
set -u

CONFIG=${CONFIG:-qwen3-30b-a3b}
PORT=18091
SLOG=/tmp/zest-graphs-serve.log
. "$(dirname "$0")/serve_lib.sh"
bench() {  # LABEL CONCURRENCY REQUESTS [RATE]
  local row
  row=$(timeout 30 "$P/zest" bench serve --url "http://127.0.0.1:$PORT" --requests "$3" --concurrency "$2" \
    --rate "${4:-0}" --prompt-len 64 --output-len 64 --seed "$2" --table-row "$1" 2>&1 |
    grep -E '^\| |^first failure|^error')
  ROWS+=("${row:-| $1 | $2 | no result |}")
  echo "${ROWS[-1]}"
}
run() {  # LABEL -- SERVER_FLAGS...
  local label=$1
  shift 2
  echo -n "$label: "
  start_server -- --cuda-graph-log "$@" || return
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
trap 'stop_server; print_table "zest serve --config $CONFIG --device ${DEVICE:-cuda} (random weights), text only, 64 words, 64 output tokens (ignore_eos), greedy"' EXIT
run "pad on" --
run "pad off" -- --no-cuda-graph-padding
