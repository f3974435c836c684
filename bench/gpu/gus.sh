# limit: 420
# The split gate/up kernel at one token (DecodeOption::kMoeDownRows 3 / 4: one CTA per 16 rows of gate or of up,
# 768 CTAs at Qwen3-30B-A3B shapes, SiLU(gate) * up formed by the down kernel by rows) against the default
# (kMoeDownRows 1: one CTA per 16 rows of both matrices): its tests, then batch-1 TPOT alternating in one process
# (with SERE S=2 as a second figure), batch 8 as a control.
"$P/test_cuda" --gtest_filter='CudaMoeOne.*:CudaDecoder.DownRows*' 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | grep -v "^\[batch\|^\[cuda-vs\|^\[moe\|^variant\|^  gate\|^  down\|^rows_mma\|^moe_one" | tail -12
"$P/bench_decode_bench" --config qwen3-30b-a3b --context 1024 --batch 1,8 --steps 60 --warmup 5 \
  --sere-primary 2 --sere-threshold 0 \
  --variant rows=1 --variant rows=3 --variant rows=4 --variant rows=4 --variant rows=3 --variant rows=1 \
  --variant rows=1 --variant rows=3 --variant rows=4 --variant rows=1 2>&1 | grep -E "TPOT|variant|^\| (1|8) "
