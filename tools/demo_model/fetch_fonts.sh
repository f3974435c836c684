#!/usr/bin/env bash
# Puts the four DejaVu fonts the task images are drawn with into tools/demo_model/fonts/ (not tracked),
# from Debian's fonts-dejavu-core package (already installed, or downloaded with apt-get).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
want=(DejaVuSans.ttf DejaVuSerif.ttf DejaVuSansMono.ttf DejaVuSerif-Bold.ttf)
mkdir -p "$here/fonts"
src=/usr/share/fonts/truetype/dejavu
if [ ! -f "$src/${want[0]}" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download fonts-dejavu-core >/dev/null && dpkg -x fonts-dejavu-core_*.deb root)
  src=$tmp/root/usr/share/fonts/truetype/dejavu
fi
for f in "${want[@]}"; do cp "$src/$f" "$here/fonts/"; done
echo "fonts in $here/fonts"
