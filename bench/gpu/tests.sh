# limit: 540
# The whole CUDA test suite, written straight to the log (gtest flushes per test, so a run cut by the time limit
# still shows which test was running). A test that makes no progress for 150 s is taken for a hang (the longest,
# CudaVisionEngine.SereProtectRanksImagePromptsOnTheDevice, runs a minute or so of host-side KL sums):
# cuda-gdb, attached, names the kernels on the GPU and where their warps are (the form that found a producer warp
# two phases behind its ring) and every host thread's stack (a host-side wait), then the run is stopped.
# GTEST_FILTER in the environment runs a part of the suite.
L=$(readlink -f /proc/$$/fd/1)
"$P/test_cuda" 2>&1 &
pid=$!
last=""
same=0
while kill -0 "$pid" 2>/dev/null; do
  sleep 2
  [ -f "$L" ] || continue
  cur=$(tail -1 "$L")
  if [ "$cur" = "$last" ]; then same=$((same + 2)); else same=0; last=$cur; fi
  if [ "$same" -ge 150 ]; then
    echo "no progress for 150 s at: $cur"
    timeout 90 cuda-gdb -p "$pid" -batch -ex 'info cuda kernels' -ex 'info cuda blocks' -ex 'info cuda warps' \
      -ex 'cuda kernel 0' -ex 'info cuda threads' -ex 'cuda kernel 1' -ex 'info cuda threads' \
      -ex 'cuda kernel 2' -ex 'info cuda threads' -ex 'thread apply all bt 12' 2>&1 | grep -v 'New LWP' | head -400
    kill -9 "$pid"
    break
  fi
done
wait "$pid"
