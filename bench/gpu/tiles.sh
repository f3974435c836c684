# limit: 120
# How fast CTAs copy weight tiles from HBM into shared memory, by method (bulk copies from one thread or 32 lanes,
# cp.async, register loads), alone on the GPU (bench_decode_bench --probe-tiles; tile_probe.h), and the probe's test.
timeout 30 "$P/test_cuda" --gtest_brief=1 --gtest_filter='CudaTileProbe*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
timeout 80 "$P/bench_decode_bench" --probe-tiles 2>&1
