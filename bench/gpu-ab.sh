#!/usr/bin/env bash
# A/B of two packages on the GPU machine, for changes that have no runtime switch: both packages (bench/gpu-package.sh
# output; e.g. the parent commit's package copied to .gpu/zest-old.tar.xz before packing the change) are carried and
# unpacked, then COMMAND runs with P set to each package in turn, A B A B ... (ROUNDS rounds, default 3), each output
# line prefixed with the package's commit. Both packages must be built from the same source tree layout. A package
# may leave out what the command does not run (the carried tree is limited to 64 MiB); one without lib/ uses the
# other's libraries.
# Usage: bash bench/gpu-ab.sh A.tar.xz B.tar.xz 'COMMAND'   (COMMAND may use "$P/bench_decode_bench" etc.)
# One-package form: bash bench/gpu-ab.sh DIR 'COMMAND', DIR an unpacked package that holds old/ (bench/gpu-package.sh
# with OLD_ZEST): DIR against DIR/old (its zest, with DIR's libraries), when two packages would not fit the carry; and
# against DIR/old2 too where the package holds one (OLD2_ZEST).
set -u
cd "$(dirname "$0")/.."
dirs=()
if [ $# -eq 2 ] && [ -d "$1/old" ]; then
  dirs=("$1" "$1/old")
  [ -d "$1/old2" ] && dirs+=("$1/old2")
  shift
  set -- "" "" "$1"
else
  [ $# -eq 3 ] || { echo "usage: bash bench/gpu-ab.sh A.tar.xz B.tar.xz 'COMMAND' | DIR 'COMMAND'" >&2; exit 2; }
  for i in 1 2; do
    pkg=${!i}
    d=/tmp/zest-ab$i
    rm -rf "$d" && mkdir -p "$d" && tar -xJf "$pkg" -C "$d" || exit 1
    dirs+=("$d/pkg")
  done
fi
src=$(cat "${dirs[0]}/source_dir")
if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for ((r = 1; r <= ${ROUNDS:-3}; ++r)); do
  for d in "${dirs[@]}"; do
    tag="$(cat "$d/commit" 2>/dev/null) r$r"
    lib=$d/lib
    [ -d "$lib" ] || lib=${dirs[0]}/lib
    [ -d "$lib" ] || lib=${dirs[1]}/lib
    P=$d LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" bash -c "export P=$d; $3" 2>&1 | sed "s|^|$tag: |"
  done
done
