#!/usr/bin/env bash
# The browser test (tests/integration/test_ui_browser.py) drives Debian's Chromium with Playwright, which
# never downloads a browser of its own (there may be no network for that): install the Debian
# package when it is missing. Run by `make test` (and so by CI's .ci/run).
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo > /dev/null; then
    sudo=(sudo)
else
    echo "ensure_chromium: /usr/bin/chromium is missing and installing it needs root or sudo (apt-get install chromium)" >&2
    exit 1
fi
echo "installing Debian's chromium for the browser test ..." >&2
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
