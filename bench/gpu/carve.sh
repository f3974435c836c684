# limit: 150
# Shared-memory carveout of every decode launch (DecodeOption::kCarveout; Qwen3-30B-A3B shapes, context 1024, one
# H200), from the timeline package (ZEST_PKG=.gpu/zest-timeline.tar.xz): TPOT at batch 1, 8, 32 and 64 with the
# driver's carveout per kernel (carve=0) and the largest one on every launch (carve=1), each with the per-kernel step
# timeline at batch 1 and 8 (whether a kernel's CTAs become resident before its release: the "early" column).
timeout 25 "$P/test_cuda_timeline" --gtest_brief=1 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
timeout 110 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 --batch 1,8,32,64 --steps 30 --warmup 5 \
  --timeline 1,8 --variant carve=0 --variant carve=1 --variant carve=1,attn=2 2>&1 | grep -vE '^sere_reroute alone'
