#!/usr/bin/env bash
# Prefill/decode disaggregation on one machine, in one command: a prefill instance, a decode instance and the front
# clients talk to (zest serve --role prefill|decode, zest front). Stops all three on Ctrl-C or when one of them exits.
#
#   bash scripts/disagg.sh [MODEL_DIR] [PORT] [-- options for both zest serve instances]
#
# MODEL_DIR defaults to models/zest-demo-vl, PORT (the front's) to 8000; 0 picks free ports. The instances listen on
# free loopback ports; their logs go to stderr with a [prefill] / [decode] / [front] prefix. ZEST names the binary
# (default build/zest, built by scripts/build.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/zest-demo-vl}
PORT=${2:-8000}
shift $(( $# < 2 ? $# : 2 ))
[ "${1:-}" = "--" ] && shift
ZEST=${ZEST:-build/zest}
[ -x "$ZEST" ] || { echo "disagg.sh: $ZEST not found; run scripts/build.sh first" >&2; exit 1; }
# The prefill instance signs the K/V params it hands out and the decode instance accepts only those it signed.
export ZEST_KV_SECRET=${ZEST_KV_SECRET:-$(head -c 24 /dev/urandom | base64)}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME ARGS...: runs zest ARGS with its log prefixed, waits for its "on http://host:port" line; sets $port.
start() {
  local name=$1; shift
  "$ZEST" "$@" >&2 2> >(tee "$dir/$name.log" | sed -u "s/^/[$name] /" >&2) &
  pids+=($!)
  port=""
  for _ in $(seq 1 1200); do  # up to 120 s (a large model loads for a while)
    port=$(sed -n 's/.*on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p' "$dir/$name.log" 2>/dev/null | head -1)
    [ -n "$port" ] && break
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "disagg.sh: the $name instance did not start" >&2; exit 1; }
}

start prefill serve --model "$MODEL" --role prefill --port 0 "$@"
p_port=$port
start decode serve --model "$MODEL" --role decode --port 0 "$@"
d_port=$port
start front front --prefill "http://127.0.0.1:$p_port" --decode "http://127.0.0.1:$d_port" --port "$PORT"
f_port=$port
echo "disagg.sh: front on http://127.0.0.1:$f_port (prefill :$p_port, decode :$d_port); Ctrl-C stops all three" >&2
wait -n "${pids[@]}"
echo "disagg.sh: an instance exited; stopping the others" >&2
