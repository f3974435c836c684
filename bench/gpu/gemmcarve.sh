# limit: 200
# The small-M tile GEMMs at the largest shared-memory carveout (gemm=9) against the default (gemm=4), on the timeline
# package: per-CTA records of one replayed step with gemm=9 ($OUT/tl-b1.txt; bench/timeline_raw.py shows whether the
# o GEMM's CTAs beside two attention CTAs still start late), then TPOT alternating (timeline build, recording off).
ZEST_TIMELINE_RAW=${OUT:-/tmp}/tl timeout 60 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 \
  --batch 1,8 --steps 20 --warmup 5 --timeline 1,8 --variant gemm=9 2>&1 | grep -E 'rows_pre|decode_attention|layer:'
timeout 25 "$P/test_cuda_timeline" --gtest_brief=1 2>&1 | grep -E 'PASSED|FAILED'
timeout 100 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 40 --warmup 5 \
  --variant gemm=4 --variant gemm=9 --variant gemm=9 --variant gemm=4 --variant gemm=4 --variant gemm=9 2>&1 |
  grep -E 'variant|^\| (1|8) '
