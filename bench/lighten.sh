#!/usr/bin/env bash
# The device tool carries the working tree, at most 64 MiB, and the tracked tree alone is ~59 MiB. A call
# moves aside what it does not need first, into the ignored .gl/, and back after:
#   bash bench/lighten.sh off demo       # models/zest-demo-vl: bench/gpu-check.sh (with .gpu/ carried)
#   bash bench/lighten.sh off check      # as demo, and the data test_cuda does not read (tests/vision/data, preprocess)
#   bash bench/lighten.sh off fixtures   # tests/fixtures/{models,ref}: tools/demo_model/gpu_eval.sh
#                                        # (the demo model, .gpu/zest-gpu.tar.xz and the fonts carried)
#   ... the device call ...
#   bash bench/lighten.sh on             # everything back (always run it: the tests need them)
set -euo pipefail
cd "$(dirname "$0")/.."
paths() {
  case "$1" in
    demo) echo models/zest-demo-vl ;;
    fixtures) echo tests/fixtures/models tests/fixtures/ref ;;
    check) echo models/zest-demo-vl tests/vision/data tests/fixtures/ref/preprocess ;;
    *) echo "unknown set '$1' (demo, check or fixtures)" >&2; exit 2 ;;
  esac
}
case "${1:-}" in
  off)
    for p in $(paths "${2:-fixtures}"); do
      [ -e ".gl/$p" ] && { echo ".gl/$p exists: run 'on' first" >&2; exit 1; }
      mkdir -p ".gl/$(dirname "$p")"
      mv "$p" ".gl/$p"
    done ;;
  on)
    # The deeper paths first; a folder whose place is taken (a deeper path of it was moved aside alone) stays.
    for p in $(paths check) $(paths fixtures); do
      if [ -e ".gl/$p" ] && [ ! -e "$p" ]; then mv ".gl/$p" "$p"; fi
    done
    find .gl -depth -type d -empty -delete 2>/dev/null
    git status --short models tests/fixtures | head -3 ;;
  *) echo "usage: $0 off [demo|check|fixtures] | on" >&2; exit 2 ;;
esac
