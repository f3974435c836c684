# limit: 560
# Prefill/decode disaggregation on one GPU (issue bar: TTFT added by the K/V transfer for an 8k-token prompt, and
# decode TPOT p99 of 32 streams while 8k-token multi-image prefills arrive, disaggregated and colocated).
# Random weights of Qwen3-VL-30B-A3B shapes (LAYERS of them: two instances must share the GPU; the same --seed gives
# both the same weights). Colocated: one zest serve. Disaggregated: --role prefill and --role decode on the same GPU
# and zest front, the K/V by CUDA IPC and over UCX. Each setup: (1) one 8k-token prompt at a time, TTFT; (2) 32 closed-loop decode streams alone;
# (3) the same streams while 4-image ~8k-token requests arrive at RATE/s. Prints one markdown table.
set -u
CONFIG=${CONFIG:-qwen3-vl-30b-a3b}
LAYERS=${LAYERS:-24}
RATE=${RATE:-0.5}
PORT=18095
SLOG=/tmp/zest-disagg-serve.log
IMG=assets/images/photo_street.jpg
. "$(dirname "$0")/serve_lib.sh"
export ZEST_KV_SECRET=bench-secret-0123456789
export MAX_CONTEXT=16384
FLAGS=(--layers "$LAYERS" --max-batched-tokens 8192)

bench() {  # bench LABEL URL_PORT [zest bench serve flags...]: one table row into ROWS
  local label=$1 port=$2 row
  shift 2
  row=$(timeout 200 "$P/zest" bench serve --url "http://127.0.0.1:$port" --table-row "$label" "$@" 2>&1 |
    grep -E '^\| |^first failure|^error')
  ROWS+=("${row:-| $label | no result |}")
}

workload() {  # workload SETUP PORT
  bench "$1, one 8k-token prompt at a time" "$2" --requests 6 --concurrency 1 --prompt-len 5400 --output-len 16
  bench "$1, 32 decode streams alone" "$2" --requests 96 --concurrency 32 --prompt-len 64 --output-len 192
  # The streams and the long multi-image prefills together; the streams' row is the one to compare.
  timeout 200 "$P/zest" bench serve --url "http://127.0.0.1:$2" --requests 8 --rate "$RATE" --images 4 --image "$IMG" \
    --image-size 1280x960 --prompt-len 2000 --output-len 8 --seed 7 --table-row "$1, the 8k prefills" \
    >/tmp/zest-disagg-prefills.log 2>&1 &
  local pre=$!
  bench "$1, 32 decode streams with 8k prefills at $RATE/s" "$2" --requests 96 --concurrency 32 --prompt-len 64 \
    --output-len 192 --seed 3
  wait "$pre"
  local pre_row
  pre_row=$(grep -E '^\| ' /tmp/zest-disagg-prefills.log | head -1)
  ROWS+=("${pre_row:-| $1, the 8k prefills | no result (timed out) |}")
}

# Colocated.
start_server -- "${FLAGS[@]}" && workload colocated "$PORT"
stop_server

# Disaggregated: prefill and decode on the same GPU, the front on $PORT; the K/V over UCX (a host copy) and by CUDA
# IPC (the device copy).
PORT_FRONT=$PORT
for KVT in ${KV_TRANSFERS:-cuda-ipc ucx}; do
PORT=$((PORT_FRONT + 1)) SLOG=/tmp/zest-disagg-prefill.log start_server -- "${FLAGS[@]}" --role prefill \
  --kv-transfer "$KVT"
PREFILL=$SERVER
PORT=$((PORT_FRONT + 2)) SLOG=/tmp/zest-disagg-decode.log start_server -- "${FLAGS[@]}" --role decode
DECODE=$SERVER
"$P/zest" front --prefill "http://127.0.0.1:$((PORT_FRONT + 1))" --decode "http://127.0.0.1:$((PORT_FRONT + 2))" \
  --port "$PORT_FRONT" >/tmp/zest-disagg-front.log 2>&1 &
FRONT=$!
for _ in $(seq 1 100); do PORT=$PORT_FRONT health && break; sleep 0.2; done
workload "disaggregated ($KVT)" "$PORT_FRONT"
for s in /tmp/zest-disagg-prefill.log /tmp/zest-disagg-decode.log; do grep -m3 -E "error|failed" "$s"; done
kill "$FRONT" "$PREFILL" "$DECODE" 2>/dev/null
wait 2>/dev/null
done
print_table "Disaggregation on one GPU ($CONFIG, $LAYERS layers, random weights)"
