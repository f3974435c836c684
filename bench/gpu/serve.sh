# limit: 240
# Load test of zest serve on the GPU: a random-weight model of Qwen3-VL-30B-A3B shapes (zest serve --config),
# driven by zest bench serve with closed-loop clients (--concurrency 1, 8, 32). Requests carry 2 distinct
# 640x480 JPEG images and ~64 words of text and generate 128 tokens (ignore_eos). VisionZip is set per
# request (vision_prune.rate 0 or 0.4); SERE (S=2, rho=0, random similarity) needs a second server.
# Prints one markdown table; the servers are killed at the end.
# CONFIG / DEVICE override the model (e.g. a tiny config.json on the CPU to try the script out).
set -u
CONFIG=${CONFIG:-qwen3-vl-30b-a3b}
DEVICE=${DEVICE:-cuda}
PORT=18080
IMG=assets/images/photo_street.jpg
SLOG=/tmp/zest-serve-bench.log
SERVER=
SEED=0  # every run gets its own seed, hence its own images (the server's encoder cache never hits)

health() {  # 0 when GET /health answers 200
  { exec 3<>"/dev/tcp/127.0.0.1/$PORT"; } 2>/dev/null || return 1
  printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  local line
  read -r -t 5 line <&3
  exec 3>&-
  [[ "$line" == *" 200"* ]]
}

start_server() {
  local t0=$(date +%s%N)
  "$P/zest" serve --config "$CONFIG" --device "$DEVICE" --port "$PORT" --max-num-seqs 32 --max-context 8192 \
    "$@" >"$SLOG" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 240); do
    if health; then
      echo "server up in $((($(date +%s%N) - t0) / 1000000)) ms: zest serve $*"
      grep -E "RANDOM|model '" "$SLOG"
      return 0
    fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.5
  done
  echo "server did not come up ($*):"
  tail -20 "$SLOG"
  return 1
}

stop_server() {
  if [ -n "$SERVER" ]; then
    kill "$SERVER" 2>/dev/null
    wait "$SERVER" 2>/dev/null
    SERVER=
  fi
}
trap stop_server EXIT

bench() {  # bench LABEL CONCURRENCY REQUESTS EXTRA_BODY
  SEED=$((SEED + 1))
  timeout 60 "$P/zest" bench serve --url "http://127.0.0.1:$PORT" --requests "$3" --concurrency "$2" \
    --images 2 --image "$IMG" --image-size 640x480 --prompt-len 64 --output-len 128 --seed "$SEED" \
    --extra-body "$4" --table-row "$1" 2>&1 | grep -E '^\| |^first failure|^error' || echo "| $1 | $2 | no result |"
}

matrix() {  # matrix SERE_LABEL SERE_ON
  for rate in 0 0.4; do
    for c in 1 8 32; do
      local n=$((c == 1 ? 4 : 2 * c))
      bench "SERE $1, VisionZip $rate" "$c" "$n" "{\"vision_prune\": {\"rate\": $rate}, \"sere\": $2}"
    done
  done
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rows=()
if start_server; then
  bench warmup 4 8 '{}' >/dev/null
  mapfile -t -O "${#rows[@]}" rows < <(matrix off false)
  grep -E "error|Error" "$SLOG" | head -5
fi
stop_server
if start_server --sere-primary 2 --sere-threshold 0; then
  bench warmup 4 8 '{}' >/dev/null
  mapfile -t -O "${#rows[@]}" rows < <(matrix "S=2" true)
  grep -E "error|Error" "$SLOG" | head -5
fi
stop_server

echo
echo "zest serve --config $CONFIG --device $DEVICE (random weights); zest bench serve, 2 images 640x480 + 64 words per request, 128 output tokens, closed-loop clients"
echo "| setup | clients | ok/requests | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | req/s | output tok/s |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
