#!/usr/bin/env bash
# Install Debian's chromium for the dashboard browser test (tests/test_dashboard_browser.py).
# Idempotent: does nothing when /usr/bin/chromium is already there. Needs root (CI runs as root).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo unknown version)"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_chromium.sh: needs root to apt-get install chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# fonts-liberation: the figures' text and the tables need a real font in a bare container.
apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
/usr/bin/chromium --version
