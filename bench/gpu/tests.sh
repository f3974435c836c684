# limit: 150
# The whole CUDA test suite (failures and the summary only; unbuffered, so a run cut by the limit still
# shows the tests that finished).
"$P/test_cuda" --gtest_brief=1 2>&1
