#!/usr/bin/env bash
# The source-level twin of check_layers.cmake, which needs a configured build: files under src/kernels include
# only core/ and kernels/ headers, files under src/transfer only core/ and transfer/ ones, and no file under src/
# includes a header by a relative path ("../x.h", or a bare "x.h" found next to the includer), which would get around
# the per-library include roots.
# Usage: bash tests/layering/check_includes.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
status=0
upward=$(grep -rnE '^\s*#\s*include\s*"' src/kernels | grep -vE '#\s*include\s*"(core|kernels)/' || true)
if [ -n "$upward" ]; then
  echo "src/kernels includes a header of a layer above core/ (kernels are op libraries on core only):"
  echo "$upward"
  status=1
fi
upward=$(grep -rnE '^\s*#\s*include\s*"' src/transfer | grep -vE '#\s*include\s*"(core|transfer)/' || true)
if [ -n "$upward" ]; then
  echo "src/transfer includes a header of a layer other than core/ (the KV transfer library is on core only):"
  echo "$upward"
  status=1
fi
relative=$(grep -rnE '^\s*#\s*include\s*"(\.\.?/|[^/"]*")' src || true)
if [ -n "$relative" ]; then
  echo "includes under src/ name headers as \"dir/file.h\" from src/:"
  echo "$relative"
  status=1
fi
[ "$status" -eq 0 ] && echo "src/kernels includes only core/ and kernels/ headers, src/transfer only core/ and" \
  "transfer/ ones; no relative includes under src/"
exit "$status"
