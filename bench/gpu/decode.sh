# limit: 90
# CUDA decode on one H200 at Qwen3-30B-A3B shapes (the decode kernels' tests run in the whole-suite job):
# TPOT per batch with the per-op cost inside the graph (ablation at batch 1 and 64), then the decode variants
# (attn: tensor-core decode attention, fuse: row ops (q/k norm + RoPE, add + RMSNorm, router + SERE + plan) in
# the GEMMs, moe: expert kernels at 3 CTAs/SM, l2: L2 prefetch mask, splitk: small-M GEMM split over CTAs), sere_reroute
# alone. Output is flushed per batch, so a cut run still reports; the newest kernels run last.
"$P/bench_decode_bench" --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 --sere-primary 2 --sere-threshold 0 \
  --steps 30 --warmup 3 --ablate 1,64 --ablate-steps 15 \
  --variant l2=0 --variant moe=1 --variant l2=31 --variant l2=16 --variant splitk=1 --variant fuse=1 --variant attn=1 \
  --variant moe=1,l2=31,fuse=1,attn=1
