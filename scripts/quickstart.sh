#!/usr/bin/env bash
# Installs everything, builds, and asks zest's bundled default model (models/zest-demo-vl, a small
# Qwen3-VL-MoE trained by tools/demo_model/) about two of its held-out example images.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
M=models/zest-demo-vl
ask() {  # ask IMAGE QUESTION EXPECTED
  echo "image $M/examples/$1"
  echo "Q: $2   (the image was drawn with the answer: $3)"
  printf 'A: '
  ./build/zest generate --model "$M" --image "$M/examples/$1" --prompt "$2" --max-tokens 24 --temperature 0
  echo
}
ask reading_0000_0.png "What does line 2 say?" "carpet 13.93"
ask charts_0000_0.png "What is the value for bread?" "12"
# The same request with its token counts and timings (TTFT, TPOT, vision tower) as JSON:
./build/zest generate --model "$M" --image "$M/examples/charts_0000_0.png" \
  --prompt "What is the value for bread?" --max-tokens 24 --temperature 0 --output-format json
