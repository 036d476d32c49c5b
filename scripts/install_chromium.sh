#!/usr/bin/env bash
# Installs Debian's Chromium for the browser tests (tests/browser) when /usr/bin/chromium is missing.
# Idempotent: does nothing when the binary is already there. Needs root (or sudo) for apt-get.
set -euo pipefail

CHROMIUM=${DAY0_CHROMIUM:-/usr/bin/chromium}

if [ -x "$CHROMIUM" ]; then
    echo "chromium present: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install_chromium.sh: $CHROMIUM is missing and this user cannot run apt-get (not root, no sudo)" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core

if [ ! -x "$CHROMIUM" ]; then
    echo "install_chromium.sh: apt-get finished but $CHROMIUM is still missing" >&2
    exit 1
fi
echo "chromium installed: $("$CHROMIUM" --version)"
