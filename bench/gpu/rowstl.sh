# limit: 200
# Step timeline of the one-token down kernel by output rows in CTA pairs (rows=1) against the folded combine (rows=0).
timeout 180 "$P/bench_decode_timeline" --config qwen3-30b-a3b --context 1024 --batch 1 --steps 30 --warmup 5 \
  --timeline 1 --variant rows=0 --variant rows=1 2>&1 | grep -vE '^sere_reroute alone|^\|'
