#!/usr/bin/env bash
# `zest eval` from the command line on the tiny VL-MoE fixture: a two-axis sweep gives one report row per
# setting in sweep order and writes the report, the predictions and a PNG plot; a bad sweep and a bad data
# line fail with a clear message and exit code 1; sere-protect's file drives eval --sere-protected.
# Usage: eval_cli_test.sh ZEST_BINARY MODEL_DIR DATA_JSONL
set -u
ZEST=$1 MODEL=$2 DATA=$3
source "$(dirname "$0")/../check.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$ZEST" eval --model "$MODEL" --data "$DATA" --device cpu --quiet --limit 4 --max-tokens 3 \
  --sweep vision-prune-rate=0,0.5 --sweep batch=1,3 --out "$dir/report.md" --predictions "$dir/pred.jsonl" \
  --plot "$dir/plot.png" >"$dir/stdout" 2>"$dir/stderr"
check "sweep exits 0" test $? -eq 0
overall=$(sed -n '/^## Overall/,/^## Task/p' "$dir/report.md" | grep '^| vision' | cut -d'|' -f2 | sed 's/ *$//;s/^ *//')
expected=$'vision-prune-rate=0 batch=1\nvision-prune-rate=0 batch=3\nvision-prune-rate=0.5 batch=1\nvision-prune-rate=0.5 batch=3'
check "one overall row per setting, in sweep order" test "$overall" = "$expected"
check "stdout is the report" cmp -s "$dir/stdout" "$dir/report.md"
check "four items in every overall row" test "$(sed -n '/^## Overall/,/^## Task/p' "$dir/report.md" | grep -c '^| vision[^|]*| 4 |')" -eq 4
check "predictions: 4 items x 4 settings" test "$(wc -l <"$dir/pred.jsonl")" -eq 16
check "plot is a PNG" test "$(head -c 8 "$dir/plot.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a

"$ZEST" eval --model "$MODEL" --data "$DATA" --quiet --sweep vision-prune-rat=0,1 >"$dir/out" 2>&1
code=$?
check "unknown sweep name fails" test $code -eq 1
check "unknown sweep name is named" grep -q 'vision-prune-rat' "$dir/out"
"$ZEST" eval --model "$MODEL" --data "$DATA" --quiet --sweep vision-prune-rate=0,2 >"$dir/out" 2>&1
check "out-of-range sweep value fails" test $? -eq 1
check "out-of-range sweep value is named" grep -q 'vision-prune-rate=2' "$dir/out"
"$ZEST" eval --model "$MODEL" --data "$DATA" --quiet --sweep batch >"$dir/out" 2>&1
check "sweep without values fails" test $? -eq 1

# SERE with a protected list made by zest sere-protect, swept over the threshold.
"$ZEST" calibrate-sere --model "$MODEL" --device cpu --tokens 64 --out "$dir/sim.safetensors" >/dev/null 2>&1
"$ZEST" sere-protect --model "$MODEL" --device cpu --tokens 16 --per-layer 2 --sere-similarity "$dir/sim.safetensors" \
  --out "$dir/protected.json" >/dev/null 2>&1
check "sere-protect writes its file" grep -q '"protected"' "$dir/protected.json"
"$ZEST" eval --model "$MODEL" --data "$DATA" --device cpu --quiet --limit 3 --max-tokens 3 --batch 3 --sere-primary 1 \
  --sere-similarity "$dir/sim.safetensors" --sere-protected "$dir/protected.json" --sweep sere-threshold=0,0.5 \
  >"$dir/sere.md" 2>&1
check "eval with protected experts" test "$(grep -c '^| sere-threshold=0\(\.5\)\? | 3 |' "$dir/sere.md")" -eq 2

printf '{"messages": [{"role": "user", "content": "hi"}], "answer": "a"}\n{"messages": \n' >"$dir/bad.jsonl"
"$ZEST" eval --model "$MODEL" --data "$dir/bad.jsonl" --quiet >"$dir/out" 2>&1
check "bad JSONL fails" test $? -eq 1
check "bad JSONL names its line" grep -q "bad.jsonl:2: not valid JSON" "$dir/out"

summary
