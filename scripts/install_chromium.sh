#!/usr/bin/env bash
# Install Debian's Chromium for the browser test (tests/browser), where this machine allows it: apt-get as root or
# through passwordless sudo. Anywhere else it only says so and succeeds: setup never waits for a password or fails
# over Chromium, and the browser test is then skipped with its reason in pytest's summary. Never
# `playwright install` (it downloads browsers from the internet).
set -uo pipefail
chromium=${EAGLE_FORGE_CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] && exit 0
[ "${EAGLE_FORGE_SKIP_BROWSER:-}" = 1 ] && exit 0
skip_note() { echo "note: $1; the browser test (tests/browser) will be skipped until Chromium is at $chromium"; exit 0; }
command -v apt-get >/dev/null || skip_note "no apt-get on this machine: install Chromium yourself"
as=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null && sudo -n true 2>/dev/null \
    || skip_note "installing Chromium needs root: run \`sudo apt-get install -y --no-install-recommends chromium\`"
  as=(sudo -n)
fi
apt=("${as[@]}" env DEBIAN_FRONTEND=noninteractive timeout 900 apt-get -q -y -o DPkg::Lock::Timeout=120)
echo "installing Chromium for the browser test (apt-get)"
if ! "${apt[@]}" install --no-install-recommends chromium >/dev/null 2>&1; then
  "${apt[@]}" update >/dev/null 2>&1
  "${apt[@]}" install --no-install-recommends chromium >/dev/null 2>&1 \
    || skip_note "apt-get could not install chromium (no package source reachable?)"
fi
[ -x "$chromium" ] || skip_note "apt-get installed chromium, but not at $chromium (set EAGLE_FORGE_CHROMIUM)"
echo "Chromium installed at $chromium"
