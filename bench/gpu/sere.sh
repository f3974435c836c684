# limit: 90
# SERE on the GPU: the device calibration tests, then calibration of a random-weight Qwen3-30B-A3B-shaped model
# (48 layers, 128 experts) on 512 tokens of the bundled corpus, on the CUDA decoder.
"$P/test_cuda" --gtest_filter='SereCalibrate*:CudaSere*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
/usr/bin/time -v "$P/zest" calibrate-sere --config qwen3-30b-a3b --device cuda --tokens 512 \
  --out /tmp/sere_sim.safetensors 2>&1 | grep -vE '^\s+(Average|Exit|Socket|Signals|Swaps|File system|Page size|Voluntary|Involuntary|Minor|Major|Percent)' | tail -25
