#!/usr/bin/env bash
# Build the visual builder (frontend/) into workflows/static/workflows/builder/, where Django serves it
# at /builder/ and the wheel ships it: `npm ci` from the committed lockfile, then `npm run build`.
# Skipped when the build in place was made from the same sources (a hash of them is kept beside it);
# --force builds anyway. Needs Node.js 20+ and npm.
set -euo pipefail
cd "$(dirname "$0")/../frontend"
out=../workflows/static/workflows/builder
# The hash of the sources the build came from: beside the sources, not in the build (which the wheel ships).
stamp=.build-source-hash
hash=$(cat package.json package-lock.json index.html vite.config.ts tsconfig.json $(find src -type f | LC_ALL=C sort) | sha256sum | cut -d' ' -f1)
if [ "${1:-}" != "--force" ] && [ -f "$out/index.html" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
  echo "== builder: the build is up to date"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is missing: install Node.js 20+ (apt-get install nodejs npm) to build the builder" >&2
  exit 1
fi
echo "== builder: npm ci && npm run build"
npm ci --no-audit --no-fund --loglevel=error
npm run build --silent
echo "$hash" >"$stamp"
