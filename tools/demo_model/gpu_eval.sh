#!/usr/bin/env bash
# On the GPU machine (run from the repository root, with .gpu/zest-gpu.tar.xz from bench/gpu-package.sh
# and tools/demo_model/fonts carried, the test fixtures moved aside by `bench/lighten.sh off fixtures`): draws the held-out split and runs `zest eval --device cuda` on the
# demo model; MEASURE=1 also runs measure.sh's sweeps on CUDA. Reports and predictions go to $OUT.
#   MODEL=models/zest-demo-vl bash tools/demo_model/gpu_eval.sh
set -euo pipefail
MODEL=${MODEL:-models/zest-demo-vl}
OUTD=${OUT:-/tmp/zest-demo-eval}
PKG=${ZEST_PKG:-.gpu/zest-gpu.tar.xz}
rm -rf /tmp/zest-pkg && mkdir -p /tmp/zest-pkg && tar -xJf "$PKG" -C /tmp/zest-pkg
P=/tmp/zest-pkg/pkg
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "package commit: $(cat "$P/commit")"
python3 tools/demo_model/make_eval.py --out /tmp/demo-eval
"$P/zest" eval --model "$MODEL" --data /tmp/demo-eval/eval.jsonl --device cuda --batch 32 --quiet \
  --predictions "$OUTD/zest_cuda.jsonl" --out "$OUTD/zest_cuda.md" >/dev/null
sed -n '/## Overall/,/## Task/p' "$OUTD/zest_cuda.md"
if [ -n "${MEASURE:-}" ]; then
  ZEST=$P/zest MODEL=$MODEL EVAL=/tmp/demo-eval OUT=/tmp/demo-quality DEVICE=cuda bash tools/demo_model/measure.sh
  tar -C /tmp -cf "$OUTD/quality.tar" demo-quality  # one file: at most 8 come back from the machine
fi
