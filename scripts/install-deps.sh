#!/usr/bin/env bash
# Installs the Debian packages zest builds and tests with (run as root on Debian 12). Idempotent:
# does nothing when every package is already installed.
set -euo pipefail
PKGS=(build-essential cmake pkg-config git python3 python3-venv curl
      nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev
      libutf8proc-dev libjpeg62-turbo-dev libpng-dev libwebp-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
