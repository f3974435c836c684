#!/usr/bin/env bash
# Run here (no GPU needed): builds the CUDA targets and packs them, with the shared libraries the GPU
# machine lacks (it has the CUDA toolkit but not zest's Debian -dev packages), into .gpu/zest-gpu.tar.xz.
# bench/gpu-check.sh runs that package on the GPU machine. TIMELINE=1 also packs the timeline tools (below).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build-gpu}
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$B" -DZEST_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DZEST_TIMELINE="$([ -n "${TIMELINE:-}" ] && echo ON || echo OFF)" >/dev/null
cmake --build "$B" -j"$(nproc)" --target test_cuda zest
rm -rf .gpu/pkg && mkdir -p .gpu/pkg/lib
cp "$B/tests/test_cuda" "$B/zest" .gpu/pkg/
# The kernel benchmarks are zest subcommands too: thin wrappers keep the bench_* names (and the package small).
for kind in decode prefill ttft; do
  printf '#!/bin/sh\nexec "$(dirname "$0")/zest" bench %s "$@"\n' "$kind" >".gpu/pkg/bench_${kind}_bench"
  chmod +x ".gpu/pkg/bench_${kind}_bench"
done
for bin in .gpu/pkg/test_cuda .gpu/pkg/zest; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt)\.so' \
  | xargs -r cp -L -t .gpu/pkg/lib
pwd >.gpu/pkg/source_dir  # tests find their fixtures through this compiled-in path
git rev-parse --short HEAD >.gpu/pkg/commit
# OLD_ZEST=DIR (a package directory, e.g. .gpu/pkg unpacked from the parent commit's package): its zest and commit go
# in as pkg/old/, for bench/gpu-ab.sh's one-package form; xz -9 stores the second binary in little more than its
# differences (the whole package stays well under the device tool's 64 MiB carry with the tracked tree).
if [ -n "${OLD_ZEST:-}" ]; then
  mkdir -p .gpu/pkg/old
  cp "$OLD_ZEST/zest" "$OLD_ZEST/commit" .gpu/pkg/old/
  cp .gpu/pkg/bench_*_bench .gpu/pkg/old/
fi
if [ -n "${OLD2_ZEST:-}" ]; then  # a third build as old2/ (a three-way A/B: the change, its parent, an older base)
  mkdir -p .gpu/pkg/old2
  cp "$OLD2_ZEST/zest" "$OLD2_ZEST/commit" .gpu/pkg/old2/
  cp .gpu/pkg/bench_*_bench .gpu/pkg/old2/
fi
tar -cf - -C .gpu pkg | xz -9 -T0 >.gpu/zest-gpu.tar.xz
echo "packed $(du -h .gpu/zest-gpu.tar.xz | cut -f1) from commit $(git rev-parse --short HEAD)"
# TIMELINE=1: also the timeline tools (the kernels built with step-timeline records: bench_decode_timeline,
# test_cuda_timeline) in their own package, .gpu/zest-timeline.tar.xz (run it with ZEST_PKG=.gpu/zest-timeline.tar.xz
# bench/gpu-batch.sh bench/gpu/timeline.sh).
if [ -n "${TIMELINE:-}" ]; then
  cmake --build "$B" -j"$(nproc)" --target bench_decode_timeline test_cuda_timeline
  rm -rf .gpu/tl && mkdir -p .gpu/tl/pkg && cp -r .gpu/pkg/lib .gpu/pkg/source_dir .gpu/pkg/commit .gpu/tl/pkg/
  cp "$B/bench/bench_decode_timeline" "$B/tests/test_cuda_timeline" .gpu/tl/pkg/
  tar -cJf .gpu/zest-timeline.tar.xz -C .gpu/tl pkg
  echo "packed $(du -h .gpu/zest-timeline.tar.xz | cut -f1) (timeline tools) from commit $(git rev-parse --short HEAD)"
fi
