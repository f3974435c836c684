# limit: 150
# The whole CUDA test suite.
"$P/test_cuda" 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
