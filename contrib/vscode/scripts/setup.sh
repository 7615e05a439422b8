#!/bin/sh
# Installs what the extension's tests need, skipping whatever is already there:
# Debian's chromium (+ libkrb5-dev for code-server's kerberos module), the extension's pinned
# dev dependencies, and the pinned e2e dependencies (code-server 4.100.3, playwright-core).
# Facts behind each step: ../shared/EDITOR-TESTING.md.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
# One installer at a time (make test runs pytest workers in parallel).
exec 9>"${TMPDIR:-/tmp}/gridd-vscode-setup.lock"
flock 9
if ! command -v chromium >/dev/null 2>&1 || ! dpkg -s libkrb5-dev >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "vscode tests need: apt-get install chromium libkrb5-dev (run as root)" >&2; exit 1
  fi
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium libkrb5-dev
fi
if [ ! -x "$here/node_modules/.bin/tsc" ] || [ ! -x "$here/node_modules/.bin/esbuild" ] || [ ! -x "$here/node_modules/.bin/vsce" ]; then
  (cd "$here" && npm install --no-audit --no-fund --no-save --loglevel=error)
fi
if [ ! -x "$here/e2e/node_modules/.bin/code-server" ] || [ ! -d "$here/e2e/node_modules/playwright-core" ]; then
  # @vscode/ripgrep (pinned 1.15.11 in code-server's lib/vscode) downloads rg from api.github.com
  # in its postinstall unless its cache already holds the archive: fill it from npm.
  RGCACHE="${TMPDIR:-/tmp}/vscode-ripgrep-cache-1.15.11"
  RGTGZ="$RGCACHE/ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz"
  if [ ! -s "$RGTGZ" ]; then
    d=$(mktemp -d)
    (cd "$d" && npm pack -q @vscode/ripgrep-linux-x64@1.18.0 >/dev/null && tar xzf vscode-ripgrep-linux-x64-1.18.0.tgz)
    mkdir -p "$RGCACHE" && tar czf "$RGTGZ" -C "$d/package/bin" rg && rm -rf "$d"
  fi
  # yes: node-pty runs `npx node-gyp` (a ~/.npmrc with yes=false cancels it);
  # unsafe_perm: code-server's postinstall refuses to run as root without it.
  (cd "$here/e2e" && npm_config_yes=true npm_config_unsafe_perm=true npm install --no-audit --no-fund --no-save --loglevel=error)
fi
