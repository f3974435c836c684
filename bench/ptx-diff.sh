#!/usr/bin/env bash
# Runs here (no GPU): whether a change alters the device code of CUDA files, by comparing the PTX that nvcc makes of
# each file at revision REV and in the working tree (comments, blank lines and the hashes in anonymous-namespace
# and internal names, which follow the file's text, left out). A refactor that gives the same PTX gives the same
# machine code, so it needs no GPU run to show that it changes neither results nor speed. Prints one line per file:
# "same" or the number of differing lines.
# Usage: bash bench/ptx-diff.sh REV src/kernels/cuda/a.cu [more .cu files]
# KEEP=1 leaves the PTX files (before / after, and their normalised forms) in a temporary folder and prints its path.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash bench/ptx-diff.sh REV FILE.cu..." >&2; exit 2; }
rev=$1
shift
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/base" "$rev"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ptx() {  # ptx ROOT FILE OUT
  "$NVCC" -DZEST_HAVE_CUDA=1 -I"$1/src" -isystem=/usr/local/cuda/include -O3 -DNDEBUG -arch=sm_90a \
    --expt-relaxed-constexpr -std=c++20 -ptx "$1/$2" -o "$3"
  grep -v '^\s*//' "$3" | sed -E 's/_GLOBAL__N__[0-9a-f]{8}_/_GN_/g; s/_INTERNAL_[0-9a-f]{8}_/_IN_/g; s/_cu_[0-9a-f]{8}/_cu_H/g; s/^\s+//; s/\s+$//' |
    grep -v '^$' >"$3.norm"
}
for f in "$@"; do
  b=$(basename "$f" .cu)
  ptx "$tmp/base" "$f" "$tmp/$b.before.ptx"
  ptx "$PWD" "$f" "$tmp/$b.after.ptx"
  n=$(diff "$tmp/$b.before.ptx.norm" "$tmp/$b.after.ptx.norm" | grep -c '^[<>]' || true)
  if [ "$n" -eq 0 ]; then echo "$f: same"; else echo "$f: $n lines differ"; fi
done
if [ -n "${KEEP:-}" ]; then echo "PTX kept in $tmp"; fi
