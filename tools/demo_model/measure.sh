#!/usr/bin/env bash
# Issue "Quality under acceleration": the accuracy/speed trade-off of VisionZip and SERE on the demo
# model's held-out set, every sweep of docs/quality.md in one go. Writes OUT/*.md (zest eval reports)
# and OUT/*.png (plots).
#   ZEST=build/zest MODEL=models/zest-demo-vl EVAL=/tmp/demo-eval OUT=/tmp/quality DEVICE=cpu \
#     bash tools/demo_model/measure.sh
# EVAL is make_eval.py's output; a sweep whose report exists in OUT is skipped (delete OUT to measure again); LIMIT=N runs the first N items only (a quick look). SCORE_LAYER (default -1,
# the demo model's best scoring block in the score_layer sweep; the engine's default is -2) scores VisionZip in
# the other sweeps.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ZEST=${ZEST:-build/zest} MODEL=${MODEL:-models/zest-demo-vl} EVAL=${EVAL:?} OUT=${OUT:?} DEVICE=${DEVICE:-cpu}
LAYER=${SCORE_LAYER:--1}
mkdir -p "$OUT"
lim=()
[ -z "${LIMIT:-}" ] || lim=(--limit "$LIMIT")
ev() {  # ev NAME ARGS...: one zest eval run (a sweep) over the held-out set
  local name=$1
  shift
  [ ! -f "$OUT/$name.md" ] || return 0  # done by an earlier call: the sweeps resume where a cut-off run stopped
  echo "== $name: $*" >&2
  "$ZEST" eval --model "$MODEL" --data "$EVAL/eval.jsonl" --device "$DEVICE" --quiet "${lim[@]}" \
    --out "$OUT/$name.md" --plot "$OUT/$name.png" "$@" >/dev/null
}

# SERE data: expert similarity from the tasks' own text, protected experts from a calibration split
# (seed 99, never the evaluated one).
if [ ! -f "$OUT/sere_similarity.safetensors" ]; then
  python3 -c "import sys; sys.path.insert(0, '$here'); import tasks; print('\n'.join(tasks.all_text()))" >"$OUT/calib.txt"
  "$ZEST" calibrate-sere --model "$MODEL" --device "$DEVICE" --text "$OUT/calib.txt" --metric frobenius \
    --out "$OUT/sere_similarity.safetensors"
fi
if [ ! -f "$OUT/sere_protected.json" ]; then
  python3 "$here/make_eval.py" --out "$OUT/calib" --per-task 10 --seed 99 >/dev/null
  "$ZEST" sere-protect --model "$MODEL" --device "$DEVICE" --data "$OUT/calib/eval.jsonl" \
    --sere-similarity "$OUT/sere_similarity.safetensors" --out "$OUT/sere_protected.json"
fi
sim=(--sere-similarity "$OUT/sere_similarity.safetensors")

ev score_layer --batch 32 --vision-prune-rate 0.4 --vision-budget-mode global --sweep vision-score-layer=-1,-2,-3,-4
ev visionzip --batch 32 --vision-score-layer "$LAYER" --sweep vision-budget-mode=uniform,global \
  --sweep vision-prune-rate=0,0.3,0.4,0.5,0.7
ev contextual --batch 32 --vision-score-layer "$LAYER" --vision-prune-rate 0.4 --vision-budget-mode global \
  --sweep vision-contextual=0,0.1,0.3
ev sere --batch 32 "${sim[@]}" --sweep sere-primary=0,1,2,3 --sweep sere-threshold=0,0.3,0.5
ev sere_batch --sere-primary 2 --sere-threshold 0.5 "${sim[@]}" --sweep batch=1,8,64
ev both --batch 32 "${sim[@]}" --vision-score-layer "$LAYER" --vision-budget-mode global --sweep vision-prune-rate=0,0.3,0.4 --sweep sere-primary=0,2 \
  --sere-threshold 0.5
ev unprotected --batch 32 "${sim[@]}" --sere-primary 1 --sere-threshold 0
ev protected --batch 32 "${sim[@]}" --sere-primary 1 --sere-threshold 0 --sere-protected "$OUT/sere_protected.json"
echo "reports in $OUT" >&2
