# limit: 90
# CUDA vision path on one H200 at Qwen3-VL-30B-A3B shapes: the vision/VisionZip/engine tests, then multi-image
# TTFT with the prefill measured on the full-depth random-weight decoder, the
# tower fused vs unfused, the pipelined front end and the per-op profile of one block at 30 images.
"$P/test_cuda" --gtest_filter='CudaVision*' 2>&1 | grep -vE '^\[ +(RUN|OK) +\]'
"$P/bench_ttft_bench" --config qwen3-vl-30b-a3b --images 30,8,1 --image-size 640x480 \
  --vision-prune-rate 0,0.3,0.4,0.5 --iters 5 --prefill-iters 2 --group 8
# Global budget over the request's images (one selection across all 30).
"$P/bench_ttft_bench" --config qwen3-vl-30b-a3b --images 30 --image-size 640x480 --vision-prune-rate 0,0.4 \
  --mode global --iters 3 --prefill-iters 1 --group 0
