#!/usr/bin/env bash
# One chunk of demo-model training on the GPU machine (run from the repository root, fonts carried in
# tools/demo_model/fonts): trains for MINUTES, resuming from WORK, then exports the model folder and
# the log under $OUT (what survives the machine); with KEEP_CKPT=1 the training state too, in parts
# (cat ckpt.pt.part* > ckpt.pt). Extra arguments go to train.py.
set -euo pipefail
WORK=${WORK:-/root/zest-demo}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import sys, torch, transformers, PIL, tokenizers; print(sys.version.split()[0], torch.__version__, transformers.__version__, PIL.__version__, tokenizers.__version__)"
python3 tools/demo_model/train.py --work "$WORK" --minutes "${MINUTES:-8}" "$@" 2>&1 | grep -v -i warn
python3 tools/demo_model/export.py --work "$WORK" --out "$WORK/model" 2>&1 | grep -v -i -E "warn|Loading weights"
if [ -n "${OUT:-}" ]; then
  tar -C "$WORK" -cf "$OUT/model.tar" model train_log.jsonl
  # the full training state (fp32 weights, optimizer), in parts under the 16 MiB a file that come back
  [ -z "${KEEP_CKPT:-}" ] || split -b 15M -d "$WORK/ckpt.pt" "$OUT/ckpt.pt.part"
fi
