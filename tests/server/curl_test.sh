#!/usr/bin/env bash
# `zest serve` driven with curl (loopback only): plain and streaming completions, an image as a data
# URL, malformed JSON and a wrong type (OpenAI error objects, 400), an unknown path (404), /health and
# /metrics, and a client that disconnects mid-stream (the request is aborted, its KV blocks freed).
# Usage: curl_test.sh ZEST_BINARY MODEL_DIR IMAGE
set -u
ZEST=$1 MODEL=$2 IMAGE=$3
source "$(dirname "$0")/../check.sh"
log=$(mktemp)
"$ZEST" serve --model "$MODEL" --port 0 --max-context 2048 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 600); do  # up to 60 s for the start-up line
  port=$(sed -n 's/.*on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p' "$log" | head -1)
  [ -n "$port" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
if [ -z "$port" ]; then echo "server did not start:"; cat "$log"; echo "0 passed, 1 failed"; exit 1; fi
URL=http://127.0.0.1:$port

body='{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":8,"temperature":0}'
out=$(curl -s -m 60 -H 'Content-Type: application/json' -d "$body" "$URL/v1/chat/completions")
check "plain completion" grep -q '"finish_reason"' <<<"$out"
check "plain usage" grep -q '"completion_tokens"' <<<"$out"

sbody='{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
sout=$(curl -s -N -m 60 -H 'Content-Type: application/json' -d "$sbody" "$URL/v1/chat/completions")
check "stream chunks" grep -q '^data: {' <<<"$sout"
check "stream done" grep -q '^data: \[DONE\]' <<<"$sout"
check "stream usage" grep -q '"usage"' <<<"$sout"

b64=$(base64 -w0 "$IMAGE")
ibody="{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,$b64\"}},{\"type\":\"text\",\"text\":\"What is this?\"}]}],\"max_tokens\":4,\"mm_processor_kwargs\":{\"min_pixels\":16384,\"max_pixels\":65536},\"vision_prune\":{\"rate\":0.5}}"
iout=$(curl -s -m 120 -H 'Content-Type: application/json' --data-binary @- "$URL/v1/chat/completions" <<<"$ibody")
check "image via data URL" grep -q '"visual_tokens_after"' <<<"$iout"

code=$(curl -s -o /tmp/zest_curl_err.$$ -w '%{http_code}' -m 30 -d '{"messages": [' "$URL/v1/chat/completions")
check "malformed JSON is 400" test "$code" = 400
check "error object" grep -q '"error"' /tmp/zest_curl_err.$$
code=$(curl -s -o /dev/null -w '%{http_code}' -m 30 -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":"x"}' "$URL/v1/chat/completions")
check "wrong type is 400" test "$code" = 400
code=$(curl -s -o /dev/null -w '%{http_code}' -m 30 "$URL/v1/nothing")
check "unknown path is 404" test "$code" = 404
rm -f /tmp/zest_curl_err.$$

# A client that goes away mid-stream: curl gives up after 0.5 s of a long generation.
code=$(curl -s -o /dev/null -w '%{http_code}' -m 30 -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4000}' "$URL/v1/chat/completions")
check "max_tokens past the 2048-token context is 400" test "$code" = 400
lbody='{"messages":[{"role":"user","content":"Tell me a long story."}],"max_tokens":2000,"ignore_eos":true,"stream":true}'
curl -s -N -m 0.5 -H 'Content-Type: application/json' -d "$lbody" "$URL/v1/chat/completions" >/dev/null
aborted=0
for _ in $(seq 1 300); do  # up to 30 s for the abort to reach the engine
  if curl -s -m 5 "$URL/metrics" | grep -q '^zest_requests_total{finish_reason="abort"} 1$'; then aborted=1; break; fi
  sleep 0.1
done
check "disconnect aborts the request" test $aborted = 1
check "KV blocks freed" bash -c "curl -s -m 5 '$URL/health' | grep -q '\"kv_blocks_used\":0'"
check "metrics" bash -c "curl -s -m 5 '$URL/metrics' | grep -q '^zest_time_to_first_token_seconds_bucket'"
check "server still up" kill -0 $pid

summary
