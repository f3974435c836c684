#!/usr/bin/env bash
# Installs the Debian packages zest builds and tests with (run as root on Debian 12), and the openai Python
# client into .venv. Idempotent: does nothing when everything is already installed.
set -euo pipefail
PKGS=(build-essential cmake pkg-config git python3 python3-venv curl
      nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev
      libutf8proc-dev libjpeg62-turbo-dev libpng-dev libwebp-dev libucx-dev libssl-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The official openai Python client for tests/server/test_openai_client.py, from PyPI into a virtual environment
# (.venv, Debian's Python refuses pip installs outside one). Without a route to PyPI this warns and that test skips.
VENV="${ZEST_PYTHON_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}"
if ! "$VENV/bin/python" -c "import openai" >/dev/null 2>&1; then
  echo "installing the openai Python package into $VENV"
  if ! { [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"; } ||
     ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check openai; then
    echo "warning: could not install the openai package; the openai-client test will be skipped" >&2
  fi
fi
