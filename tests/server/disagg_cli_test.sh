#!/usr/bin/env bash
# scripts/disagg.sh (prefill, decode and front in one command) driven with curl: a plain, a streamed and an image
# chat completion through the front equal the same requests on one `zest serve`; stopping the script stops all three.
# Usage: disagg_cli_test.sh ZEST_BINARY MODEL_DIR IMAGE
set -u
ZEST=$1 MODEL=$2 IMAGE=$3
source "$(dirname "$0")/../check.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
log=$(mktemp) slog=$(mktemp)
ZEST="$ZEST" setsid bash "$ROOT/scripts/disagg.sh" "$MODEL" 0 -- --max-context 2048 2>"$log" &
spid=$!
"$ZEST" serve --model "$MODEL" --port 0 --max-context 2048 2>"$slog" &
bpid=$!
trap 'kill -- -$spid 2>/dev/null; kill $bpid 2>/dev/null; wait 2>/dev/null; rm -f "$log" "$slog"' EXIT
wait_port() {  # wait_port LOG PATTERN
  local p=""
  for _ in $(seq 1 900); do
    p=$(sed -n "s/.*$2 on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p" "$1" | head -1)
    [ -n "$p" ] && break
    sleep 0.1
  done
  echo "$p"
}
front=$(wait_port "$log" "front")
single=$(wait_port "$slog" "'[^']*'")
if [ -z "$front" ] || [ -z "$single" ]; then echo "did not start:"; cat "$log" "$slog"; echo "0 passed, 1 failed"; exit 1; fi
ask() {  # ask PORT BODY -> the reply's content (or the stream's concatenated deltas)
  curl -s -N -m 120 -H 'Content-Type: application/json' --data-binary @- "http://127.0.0.1:$1/v1/chat/completions" <<<"$2"
}
body='{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":12,"temperature":0,"ignore_eos":true}'
want=$(ask "$single" "$body" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
got=$(ask "$front" "$body" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
check "plain reply equals one instance's" test -n "$want" -a "$got" = "$want"
sbody='{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":12,"temperature":0,"ignore_eos":true,"stream":true}'
streamed=$(ask "$front" "$sbody" | python3 -c '
import json, sys
text = ""
for line in sys.stdin:
    line = line.strip()
    if line.startswith("data: {"):
        d = json.loads(line[6:])["choices"]
        if d and "content" in d[0]["delta"]: text += d[0]["delta"]["content"]
print(text)')
check "streamed reply equals one instance's" test "$streamed" = "$want"
b64=$(base64 -w0 "$IMAGE")
ibody="{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,$b64\"}},{\"type\":\"text\",\"text\":\"What is this?\"}]}],\"max_tokens\":6,\"temperature\":0,\"mm_processor_kwargs\":{\"min_pixels\":16384,\"max_pixels\":65536},\"vision_prune\":{\"rate\":0.4}}"
iwant=$(ask "$single" "$ibody" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["choices"][0]["message"]["content"], j["usage"]["prompt_tokens"])')
igot=$(ask "$front" "$ibody" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["choices"][0]["message"]["content"], j["usage"]["prompt_tokens"])')
check "image reply equals one instance's" test -n "$iwant" -a "$igot" = "$iwant"
code=$(curl -s -o /dev/null -w '%{http_code}' -m 30 "http://127.0.0.1:$front/health")
check "front health" test "$code" = 200
kill $spid 2>/dev/null  # the script alone: its trap stops the instances
stopped=0
for _ in $(seq 1 100); do
  if ! pgrep -f "role prefill.*--port 0" >/dev/null && ! kill -0 $spid 2>/dev/null; then stopped=1; break; fi
  sleep 0.1
done
check "stopping the script stops its instances" test $stopped = 1
summary
