#!/usr/bin/env bash
# Installs everything, builds, and runs zest on the bundled default model with a bundled image.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/zest generate --model tests/fixtures/models/qwen3_vl_moe_tiny \
  --image assets/images/chart_line_pew_china.png --prompt "What does this chart show?" \
  --max-tokens 24 --temperature 0 --output-format json
