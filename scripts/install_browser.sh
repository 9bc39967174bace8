#!/usr/bin/env bash
# Install headless Chromium and its driver from Debian's packages when they are missing (needs root,
# as in CI). The browser tests (tests/test_browser.py) use them; without them they are skipped.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "chromium/chromedriver missing: run as root, or apt-get install chromium chromium-driver" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends chromium chromium-driver
