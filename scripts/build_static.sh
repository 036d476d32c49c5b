#!/usr/bin/env bash
# Installs the pinned browser libraries (frontend/package-lock.json) and copies their dist files into
# static/vendor/, where the pages load them from (no CDN: the pages work offline).
# `npm ci` runs only when the lock file changed since the last install, so a second run needs no network.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
FRONTEND="$ROOT/frontend"
VENDOR="$ROOT/static/vendor"
STAMP="$FRONTEND/node_modules/.day0-lock.sha256"

lock_sum=$(sha256sum "$FRONTEND/package-lock.json" | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$lock_sum" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "build_static.sh: npm is not installed (needed once to install frontend/package-lock.json)" >&2
        exit 1
    fi
    (cd "$FRONTEND" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error)
    echo "$lock_sum" > "$STAMP"
fi

copy() {  # copy SRC (relative to node_modules) to DEST (relative to static/vendor)
    local src="$FRONTEND/node_modules/$1" dest="$VENDOR/$2"
    if [ ! -f "$src" ]; then
        echo "build_static.sh: $src is missing after npm ci" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$dest")"
    cp "$src" "$dest"
}

copy echarts/dist/echarts.min.js echarts/echarts.min.js
copy echarts/LICENSE echarts/LICENSE
copy echarts/NOTICE echarts/NOTICE
echo "static/vendor: $(cd "$VENDOR" && find . -type f | sort | tr '\n' ' ')"
