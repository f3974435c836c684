#!/usr/bin/env bash
# The device tool carries the working tree, at most 64 MiB. A call that needs the demo model, the CUDA
# package (.gpu/) and the fonts but not the test fixtures can move the fixtures aside first:
#   bash tools/demo_model/lighten.sh off   # tests/fixtures/{models,ref} -> .gl/ (ignored)
#   ... the device call ...
#   bash tools/demo_model/lighten.sh on    # and back (always run it: the tests need them)
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  off)
    mkdir -p .gl/fixtures
    for d in models ref; do
      [ -e ".gl/fixtures/$d" ] && { echo ".gl/fixtures/$d exists: run 'on' first" >&2; exit 1; }
      mv "tests/fixtures/$d" ".gl/fixtures/$d"
    done ;;
  on)
    for d in models ref; do
      [ -e ".gl/fixtures/$d" ] && mv ".gl/fixtures/$d" "tests/fixtures/$d"
    done
    git status --short tests/fixtures | head -3 ;;
  *) echo "usage: $0 off|on" >&2; exit 2 ;;
esac
