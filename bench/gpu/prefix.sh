# limit: 300
# REPEAT: conversations per pass (default 5).
# Multi-turn chat with three images on one zest serve of Qwen3-VL-30B-A3B shapes (random weights): turn 2 re-sends
# the history (images included); with automatic prefix caching it skips the images' encoding and the cached prefill.
# bench/prefix_chat.py against a server with prefix caching and one without (--no-enable-prefix-caching): TTFT of
# each turn, cached tokens, and the replies compared (greedy: the same tokens with and without the cache).
set -u
CONFIG=${CONFIG:-qwen3-vl-30b-a3b}
PORT=18091
SLOG=/tmp/zest-prefix-serve.log
. "$(dirname "$0")/serve_lib.sh"
IMG=/tmp/zest-prefix-images
mkdir -p "$IMG"
python3 - "$IMG" <<'PY'
import sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for i in range(3):  # 896 x 672: 28 x 21 merged tokens of 32 px, 588 visual tokens each
    y, x = np.mgrid[0:672, 0:896]
    base = np.stack([(x * (i + 1)) % 256, (y * (i + 2)) % 256, ((x + y) * 3) % 256], -1)
    img = np.clip(base + rng.normal(0, 24, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(f"{sys.argv[1]}/img{i}.png")
PY
for mode in on off; do
  flags=""
  [ "$mode" = off ] && flags="--no-enable-prefix-caching"
  start_server -- $flags || continue
  python3 bench/prefix_chat.py --url "http://127.0.0.1:$PORT" --image "$IMG/img0.png" --image "$IMG/img1.png" \
    --image "$IMG/img2.png" --turns 2 --repeat "${REPEAT:-5}" --max-tokens 16 --out "/tmp/zest-prefix-$mode.json" \
    --label "prefix caching $mode"
  # One output token: the time to the engine's first token, whatever the random weights' first pieces are.
  python3 bench/prefix_chat.py --url "http://127.0.0.1:$PORT" --image "$IMG/img0.png" --image "$IMG/img1.png" \
    --image "$IMG/img2.png" --turns 2 --repeat "${REPEAT:-5}" --max-tokens 1 --tag b --label "prefix caching $mode, max_tokens 1" | tail -2
  stop_server
done
cmp -s /tmp/zest-prefix-on.json /tmp/zest-prefix-off.json && echo "replies: identical with and without the cache" \
  || echo "replies: DIFFER with and without the cache"
