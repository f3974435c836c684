# limit: 200
# The served decode step against the decoder's own: how much of a served TPOT is neither the step's kernels nor
# the decoder's call.
# 1. bench_decode_bench (the serving decoder's forward_sample per step, graph-replayed, nothing else between steps) at
#    batch 1 and 8, context 256, with one eager step's per-kernel times;
# 2. zest serve --config qwen3-30b-a3b (same shapes, random weights), text only, 64 words, 256 output tokens
#    (ignore_eos, greedy), 1 and 8 closed-loop clients: TPOT p50 as the client sees it, and the engine's own
#    per-step figures from /metrics (zest_engine_*: wall time of a decode step, of its forward call, the rest).
# MODES: one server per word, "default" or one zest serve flag written as --name=value (e.g. --cuda-graphs=eager);
# SERVER_FLAGS: more zest serve flags (MAX_CONTEXT: its --max-context, default 8192); SKIP_DECODER=1 skips step 1; RUNS: CLIENTS:greedy|top-k words.
set -u
CONFIG=${CONFIG:-qwen3-30b-a3b}
PORT=18095
SLOG=/tmp/zest-servegap.log
. "$(dirname "$0")/serve_lib.sh"
[ "${SKIP_DECODER:-0}" = 1 ] || "$P/bench_decode_bench" --config "$CONFIG" --batch 1,8 --context 256 --steps 100 --warmup 10 --profile 2>&1 |
  grep -E '^\||batch [0-9]+: TPOT|eager step|sample'

engine_metrics() {
  { exec 3<>"/dev/tcp/127.0.0.1/$PORT"; } 2>/dev/null || return
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  timeout 5 cat <&3 | grep -E '^zest_engine_' | tr '\n' ' '
  exec 3>&-
  echo
}
bench() {  # LABEL CONCURRENCY REQUESTS [EXTRA_BODY]
  local row
  row=$(timeout 60 "$P/zest" bench serve --url "http://127.0.0.1:$PORT" --requests "$3" --concurrency "$2" \
    --prompt-len 64 --output-len 256 --seed "$2" --extra-body "${4:-{\}}" --table-row "$1" 2>&1 |
    grep -E '^\| |^first failure|^error')
  ROWS+=("${row:-| $1 | $2 | no result |}")
}
trap 'stop_server; print_table "zest serve --config $CONFIG (random weights), text only, 64 words, 256 output tokens (ignore_eos), greedy unless named"' EXIT
for mode in ${MODES:-default}; do
  flag=
  [ "$mode" != default ] && flag=$mode
  start_server -- ${SERVER_FLAGS:-} $flag || continue
  bench warmup 8 8 >/dev/null
  unset 'ROWS[-1]'
  for run in ${RUNS:-1:greedy 8:greedy 1:top-k}; do
    set -- ${run/:/ }
    local_body='{}'
    [ "$2" = top-k ] && local_body='{"temperature": 0.8, "top_k": 50}'
    engine_metrics >/tmp/m0.txt
    bench "$mode, $2" "$1" $(($1 == 1 ? 3 : 2 * $1)) "$local_body"
    engine_metrics >/tmp/m1.txt
    # Per decode step over the run (differences of the counters): the interval between decode steps' starts, the
    # forward call, the step; and the interval less the forward call (host time outside it).
    echo "$mode, $1 clients, $2: engine per decode step: $(cat /tmp/m0.txt /tmp/m1.txt |
      awk '{for (i = 1; i < NF; i += 2) v[$i] = (($i in v) ? $(i + 1) - v[$i] : $(i + 1))} END {
        n = v["zest_engine_decode_steps_total"]; ni = v["zest_engine_decode_intervals_total"]
        if (n > 0 && ni > 0) printf "%d steps, interval %.3f ms, forward %.3f ms, step %.3f ms, interval - forward %.3f ms",
          n, 1e3 * v["zest_engine_decode_interval_seconds_total"] / ni, 1e3 * v["zest_engine_decode_forward_seconds_total"] / n,
          1e3 * v["zest_engine_decode_step_seconds_total"] / n,
          1e3 * (v["zest_engine_decode_interval_seconds_total"] / ni - v["zest_engine_decode_forward_seconds_total"] / n)}')"
  done
  grep -c "decode graph captured" "$SLOG" | sed "s/^/$mode: graphs captured (with --cuda-graph-log in SERVER_FLAGS): /"
  stop_server
done
