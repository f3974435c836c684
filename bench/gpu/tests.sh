# limit: 330
# The whole CUDA test suite, written straight to the log (gtest flushes per test, so a run cut by the time
# limit still shows which test was running).
"$P/test_cuda" 2>&1
