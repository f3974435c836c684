#!/usr/bin/env bash
# `zest generate` and `zest logits` on the FP8 fixture (tests/fixtures/fp8) with the CPU backend: the reference
# case 'short' gives transformers' 16 greedy tokens and its last-position logits within 1e-3 of max |ref|.
# Usage: fp8_cli_test.sh ZEST_BINARY FP8_FIXTURE_ROOT PYTHON3
set -u
ZEST=$1 ROOT=$2 PY=$3
MODEL=$ROOT/models/qwen3_moe_fp8_tiny
REF=$ROOT/ref/qwen3_moe_fp8_tiny
source "$(dirname "$0")/../check.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$PY" -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["request"], open(sys.argv[2], "w"))' \
  "$REF/short.json" "$dir/req.json"

"$ZEST" generate --model "$MODEL" --device cpu --request "$dir/req.json" --output-format json >"$dir/gen.json" 2>"$dir/err"
check "generate exits 0" test $? -eq 0
check "generate: greedy tokens equal transformers'" "$PY" -c '
import json, sys
got = json.load(open(sys.argv[1]))["token_ids"]
want = json.load(open(sys.argv[2]))["greedy_tokens"]
print("zest", got, "\ntransformers", want) if got != want else None
sys.exit(got != want)' "$dir/gen.json" "$REF/short.json"

"$ZEST" logits --model "$MODEL" --device cpu --request "$dir/req.json" --out "$dir/logits.npy" >"$dir/ids" 2>"$dir/err"
check "logits exits 0" test $? -eq 0
check "logits: prompt ids equal transformers'" "$PY" -c '
import json, sys
got = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
sys.exit(got != json.load(open(sys.argv[2]))["prompt_ids"])' "$dir/ids" "$REF/short.json"
check "logits within 1e-3 of max |ref|" "$PY" -c '
import ast, struct, sys
def npy(path):  # float32 little-endian .npy, no numpy needed
    b = open(path, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    head = ast.literal_eval(b[10:10 + n].decode())
    assert head["descr"] == "<f4", head
    return struct.unpack("<%df" % (len(b[10 + n:]) // 4), b[10 + n:])
got, want = npy(sys.argv[1]), npy(sys.argv[2])
diff = max(abs(a - b) for a, b in zip(got, want)) / max(abs(b) for b in want)
print("max |zest - transformers| / max |ref| = %.3g" % diff)
sys.exit(not (len(got) == len(want) == 1024 and diff <= 1e-3))' "$dir/logits.npy" "$REF/short.logits.npy"

summary "fp8 cli"
