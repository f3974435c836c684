# limit: 240
# Load test of zest serve on the GPU: a random-weight model of Qwen3-VL-30B-A3B shapes (zest serve --config),
# driven by zest bench serve with closed-loop clients (--concurrency 1, 8, 32). Requests carry 2 distinct
# 640x480 JPEG images and ~64 words of text and generate 128 tokens (ignore_eos). VisionZip is set per
# request (vision_prune.rate 0 or 0.4); SERE (S=2, rho=0, random similarity) needs a second server (SKEW=1
# adds two servers with skewed expert popularity).
# Prints one markdown table; the servers are killed at the end.
# CONFIG / DEVICE override the model (e.g. a tiny config.json on the CPU to try the script out).
set -u
CONFIG=${CONFIG:-qwen3-vl-30b-a3b}
DEVICE=${DEVICE:-cuda}
PORT=18080
IMG=assets/images/photo_street.jpg
SLOG=/tmp/zest-serve-bench.log
SEED=0  # every run gets its own seed, hence its own images (the server's encoder cache never hits)
. "$(dirname "$0")/serve_lib.sh"

bench() {  # bench LABEL CONCURRENCY REQUESTS IMAGES EXTRA_BODY: appends one table row to ROWS
  SEED=$((SEED + 1))
  local row
  row=$(timeout 60 "$P/zest" bench serve --url "http://127.0.0.1:$PORT" --requests "$3" --concurrency "$2" \
    --images "$4" --image "$IMG" --image-size 640x480 --prompt-len 64 --output-len 128 --seed "$SEED" \
    --extra-body "$5" --table-row "$1" 2>&1 | grep -E '^\| |^first failure|^error')
  ROWS+=("${row:-| $1 | $2 | no result |}")
}

sere_gauges() {  # mean over layers of SERE's experts per layer before / after, from /metrics
  { exec 3<>"/dev/tcp/127.0.0.1/$PORT"; } 2>/dev/null || return
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  timeout 5 cat <&3 | awk '/^zest_sere_experts_per_layer_before/ {b += $2; nb++} /^zest_sere_experts_per_layer_after/ {a += $2; na++}
    END {if (nb) printf "%.1f -> %.1f distinct experts per MoE layer per re-routed step", b / nb, a / na}'
  exec 3>&-
}

run_server() {  # run_server full|short SERE_LABEL SERE_ON [server flags]
  local mode=$1 label=$2 on=$3
  shift 3
  start_server -- "$@" || return
  grep -E "RANDOM|model '" "$SLOG"
  bench warmup 4 8 2 '{"sere": false}'  # not re-routed, so the SERE gauges below count the next run only
  unset 'ROWS[-1]'
  # Text only (64 words, 128 tokens): decode dominates. GPU utilisation sampled during the 32-client run.
  local cs="32 8" rates="0 0.4"
  [ "$mode" = short ] && cs=32 && rates=0.4
  for c in $cs; do
    [ "$c" = 32 ] && gpu_busy_start /tmp/zest-util.txt
    bench "SERE $label, text only" "$c" $((2 * c)) 0 "{\"sere\": $on}"
    if [ "$c" = 32 ]; then
      echo "SERE $label, 32 text clients: GPU busy $(gpu_busy_stop /tmp/zest-util.txt)"
      [ "$on" = true ] && echo "SERE $label, 32 text clients: $(sere_gauges)"
    fi
  done
  for rate in $rates; do
    for c in 1 8 32; do
      [ "$mode" = short ] && [ "$c" = 1 ] && continue
      bench "SERE $label, 2 images, VisionZip $rate" "$c" $((c == 1 ? 4 : 2 * c)) 2 \
        "{\"vision_prune\": {\"rate\": $rate}, \"sere\": $on}"
    done
  done
  grep -E "error|Error" "$SLOG" | head -5
  stop_server
}

trap 'stop_server; print_table "zest serve --config $CONFIG --device $DEVICE (random weights); zest bench serve with closed-loop clients, 2x clients requests (4 at 1 client), 64 words (+ 2 distinct 640x480 JPEGs) per request, 128 output tokens (ignore_eos)"' EXIT

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
run_server full off false
run_server full "S=2" true --sere-primary 2 --sere-threshold 0
# SKEW=1: two more servers with Zipf-like expert popularity (--skew 1: router logits biased by
# -ln(rank + 1)); about 45 s more.
if [ "${SKEW:-0}" = 1 ]; then
  run_server short "off (skew 1)" false --skew 1
  run_server short "S=2 (skew 1)" true --skew 1 --sere-primary 2 --sere-threshold 0
fi
