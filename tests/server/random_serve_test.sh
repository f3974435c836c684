#!/usr/bin/env bash
# `zest serve --config` (a random-weight model) on the CPU, driven by `zest bench serve`: the start-up log
# says the weights are random, SERE runs on a random similarity, requests with images succeed (VisionZip
# per request), and the --table-row line reports every request; plus the error paths of --config and of
# `zest bench decode|prefill|ttft` without a usable GPU.
# Usage: random_serve_test.sh ZEST_BINARY CONFIG_JSON IMAGE
set -u
ZEST=$1 CONFIG=$2 IMAGE=$3
source "$(dirname "$0")/../check.sh"

out=$("$ZEST" serve --config no-such-shape --device cpu 2>&1)
check "unknown config exits non-zero" test $? -ne 0
check "unknown config names the known shapes" grep -q "unknown model config 'no-such-shape'.*qwen3-vl-30b-a3b" <<<"$out"
out=$("$ZEST" serve --device cpu 2>&1)
check "no model and no config exits non-zero" test $? -ne 0
check "no model and no config says what to give" grep -q -- "--model DIR.*--config NAME" <<<"$out"
out=$("$ZEST" serve --config qwen3-vl-30b-a3b --device cpu 2>&1)
check "a 30B shape on the CPU is refused" grep -q "16 GiB" <<<"$out"
out=$("$ZEST" serve --config "$CONFIG" --tokenizer /nonexistent --device cpu 2>&1)
check "a missing tokenizer is an error" grep -q "tokenizer /nonexistent" <<<"$out"
for b in decode prefill ttft; do
  out=$(CUDA_VISIBLE_DEVICES= "$ZEST" bench $b --config qwen3-30b-a3b 2>&1)
  check "bench $b without a GPU exits non-zero" test $? -ne 0
  check "bench $b without a GPU says why" grep -qiE "CUDA|GPU" <<<"$out"
done
out=$("$ZEST" bench decode --help 2>&1)
check "bench decode --help reaches the benchmark's options (or says it needs CUDA)" grep -qE -- "--batch|without CUDA" <<<"$out"

log=$(mktemp)
"$ZEST" serve --config "$CONFIG" --layers 2 --device cpu --port 0 --max-context 4096 --sere-primary 2 \
  --sere-threshold 0 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 600); do  # up to 60 s for the start-up line
  port=$(sed -n 's/.*on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p' "$log" | head -1)
  [ -n "$port" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
if [ -z "$port" ]; then echo "server did not start:"; cat "$log"; echo "$pass passed, $((fail + 1)) failed"; exit 1; fi
URL=http://127.0.0.1:$port
check "start-up log says RANDOM WEIGHTS" grep -q "RANDOM WEIGHTS.*2 decoder layers" "$log"

report=$("$ZEST" bench serve --url "$URL" --requests 4 --concurrency 2 --images 2 --image "$IMAGE" --image-size 96x64 \
  --prompt-len 16 --output-len 6 --extra-body '{"vision_prune": {"rate": 0.5}}' --table-row random 2>&1)
row=$(grep '^| random' <<<"$report")
check "bench serve row" grep -q '^| random | 2 | 4/4 |' <<<"$row"
# The server's own decode-step figures over the run (its /metrics counters before and after).
check "bench serve reports the engine's decode steps" grep -qE '^Decode steps: +[1-9]' <<<"$report"
check "bench serve reports the interval between decode steps" \
  grep -qE '^Mean interval between steps \(ms\): +[0-9]+\.[0-9]{3}' <<<"$report"
metrics=$(curl -s -m 10 "$URL/metrics")
check "SERE re-routed decode steps" grep -q '^zest_sere_experts_per_layer_after{layer="1"}' <<<"$metrics"
out=$("$ZEST" bench serve --url "$URL" --requests 1 --extra-body '[1]' 2>&1)
check "a non-object --extra-body is an error" grep -q "JSON object" <<<"$out"
out=$("$ZEST" bench serve --url "$URL" --requests 1 --images 1 --image "$IMAGE" --image-size 12by4 2>&1)
check "a bad --image-size is an error" grep -q "not WxH" <<<"$out"

summary
