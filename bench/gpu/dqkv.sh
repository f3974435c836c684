# limit: 560
# The next layer's qkv projection run by the one-token down kernel by rows (DecodeOption::kDownQkv 1: its CTAs copy
# the qkv weight rows into the shared memory their down weights leave, then a grid barrier) against its own launch
# (0): the tests that cover it, then decode TPOT alternating in one process (batch 8 as a control: the option applies
# at one token only). RACE=1: racecheck and memcheck of the kernel's test instead.
set -u
if [ -n "${RACE:-}" ]; then
  for tool in racecheck memcheck; do
    start=$(date +%s)
    timeout "${EACH:-200}" /usr/local/cuda/bin/compute-sanitizer --tool $tool --print-limit 50 "$P/test_cuda" \
      --gtest_filter='CudaMoeOne.DownPairRunsTheNextQkvProjection' >/tmp/san.log 2>&1
    echo "== $tool: rc=$? $(($(date +%s) - start)) s"
    grep -E "SUMMARY|^\[  (PASSED|FAILED)" /tmp/san.log | head -3
    grep -oE "[A-Za-z_0-9]+\.(cu|cuh):[0-9]+" /tmp/san.log | sort | uniq -c | sort -rn | head -4
  done
  exit 0
fi
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaDecoder.DownRows*:CudaLatencyGemm.*:CudaGraph*' 2>&1 |
  grep -E '^\[  (PASSED|FAILED)|^\[==========\]|Failure|error' | head -12
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 60 --warmup 5 --variant dqkv=0 \
  --variant dqkv=1 --variant dqkv=1 --variant dqkv=0 --variant dqkv=0 --variant dqkv=1 2>&1 |
  grep -E 'copy bandwidth|variant|^\| (1|8) '
