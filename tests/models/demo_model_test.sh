#!/usr/bin/env bash
# The bundled demo model answers questions about its bundled example images (held-out images drawn by
# tools/demo_model/tasks.py; the answers are the generator's ground truth, not zest's outputs):
# `zest eval` over the examples must get every one exactly right, and `zest generate` must print the
# first one's answer.
# Usage: demo_model_test.sh ZEST_BINARY MODEL_DIR
set -u
ZEST=$1 MODEL=$2
DATA=$MODEL/examples/examples.jsonl
source "$(dirname "$0")/../check.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

n=$(grep -c . "$DATA")
check "at least 5 examples" test "$n" -ge 5
"$ZEST" eval --model "$MODEL" --data "$DATA" --device cpu --quiet --predictions "$dir/pred.jsonl" >"$dir/report" 2>"$dir/err"
check "eval exits 0" test $? -eq 0
check "one prediction an example" test "$(grep -c . "$dir/pred.jsonl")" -eq "$n"
wrong=$(python3 -c 'import json,sys; [print(l.strip()) for l in open(sys.argv[1]) if json.loads(l)["exact"] != 1]' "$dir/pred.jsonl")
check "every example answered exactly" test -z "$wrong"
[ -z "$wrong" ] || echo "$wrong"

# The first example through `zest generate`, as the quickstart runs it.
image=$(python3 -c 'import json,sys; j=json.loads(open(sys.argv[1]).readline()); print([p["image_url"]["url"] for p in j["messages"][0]["content"] if p["type"]=="image_url"][0])' "$DATA")
question=$(python3 -c 'import json,sys; j=json.loads(open(sys.argv[1]).readline()); print([p["text"] for p in j["messages"][0]["content"] if p["type"]=="text"][-1])' "$DATA")
answer=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["answer"])' "$DATA")
got=$("$ZEST" generate --model "$MODEL" --image "$MODEL/examples/$image" --prompt "$question" --max-tokens 16 2>/dev/null)
check "generate prints the answer ($answer)" test "$got" = "$answer"
[ "$got" = "$answer" ] || echo "generate printed: $got"

summary
