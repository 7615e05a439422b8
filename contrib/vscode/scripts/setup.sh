#!/bin/sh
# Installs what the extension's tests need, skipping whatever is already there:
# Debian's chromium (+ libkrb5-dev for code-server's kerberos module), the extension's pinned
# dev dependencies, and the pinned e2e dependencies (code-server 4.100.3, playwright-core).
# Facts behind each step: ../shared/EDITOR-TESTING.md.
#
# The npm trees are installed once per machine (`npm ci` from the committed package-lock.json)
# into a cache keyed by package.json and its lock ($GRIDD_VSCODE_CACHE, default
# ~/.cache/gridd-vscode) and linked as node_modules, so several checkouts (worktrees) share one
# 300 MB install instead of compiling it each.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
cache="${GRIDD_VSCODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gridd-vscode}"
mkdir -p "$cache"
# One installer at a time (make test runs pytest workers in parallel; checkouts share the cache).
exec 9>"$cache/.lock"
flock 9

# Native modules (code-server's argon2, kerberos, node-pty) build with node-gyp, which otherwise
# downloads Node's headers from nodejs.org: a machine that reaches only the package registries
# has them from Debian's nodejs (/usr/include/node), so build against those.
if [ -z "${npm_config_nodedir:-}" ] && [ -f /usr/include/node/node.h ]; then
  export npm_config_nodedir=/usr
fi

# The UI tests need Debian's chromium, and code-server's kerberos module needs libkrb5-dev.
# Without them and without root, only those tests are skipped (they say so); the rest runs.
# `setup.sh lint` (make lint) wants only the extension's own dev dependencies: no apt, no code-server.
chromium="${GRIDD_CHROMIUM:-/usr/bin/chromium}"
ui=1
if [ "${1:-}" = lint ]; then
  ui=0
elif [ ! -x "$chromium" ] || ! dpkg -s libkrb5-dev >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: the editor's UI tests will be skipped: they need Debian's chromium and libkrb5-dev (as root: apt-get install chromium libkrb5-dev)" >&2
    ui=0
  else
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium libkrb5-dev
  fi
fi

# link DIR BIN...: make DIR/node_modules the cached install of DIR/package.json's devDependencies.
link() {
  dir=$1; shift
  # The key covers the lock: a changed lock is a new install, never a stale tree linked in.
  key=$( (node -e 'const p=require(process.argv[1]);process.stdout.write(JSON.stringify([p.devDependencies,p.allowScripts||{}]))' "$dir/package.json"
          if [ -f "$dir/package-lock.json" ]; then cat "$dir/package-lock.json"; fi) | sha256sum | cut -c1-16)
  target="$cache/$(basename "$dir")-$key"
  # Already there: the link to this key's tree, or a node_modules of the user's own making.
  if [ ! -L "$dir/node_modules" ] || [ "$(readlink "$dir/node_modules")" = "$target/node_modules" ]; then
    ok=1
    for bin in "$@"; do [ -e "$dir/node_modules/.bin/$bin" ] || ok=0; done
    [ $ok = 1 ] && return 0
  fi
  ok=1
  for bin in "$@"; do [ -e "$target/node_modules/.bin/$bin" ] || ok=0; done
  if [ $ok = 0 ]; then
    rm -rf "$target" && mkdir -p "$target" && cp "$dir/package.json" "$target/"
    if [ -f "$dir/package-lock.json" ]; then cp "$dir/package-lock.json" "$target/"; fi
    install_into "$target"
  fi
  rm -rf "$dir/node_modules"
  ln -s "$target/node_modules" "$dir/node_modules"
}

install_into() {
  if grep -q code-server "$1/package.json"; then
    # @vscode/ripgrep (pinned 1.15.11 in code-server's lib/vscode) downloads rg from api.github.com
    # in its postinstall unless its cache already holds the archive: fill it from npm.
    RGCACHE="${TMPDIR:-/tmp}/vscode-ripgrep-cache-1.15.11"
    RGTGZ="$RGCACHE/ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz"
    if [ ! -s "$RGTGZ" ]; then
      d=$(mktemp -d)
      (cd "$d" && npm pack -q @vscode/ripgrep-linux-x64@1.18.0 >/dev/null && tar xzf vscode-ripgrep-linux-x64-1.18.0.tgz)
      mkdir -p "$RGCACHE" && tar czf "$RGTGZ" -C "$d/package/bin" rg && rm -rf "$d"
    fi
  fi
  # yes: node-pty runs `npx node-gyp` (a ~/.npmrc with yes=false cancels it);
  # unsafe_perm: code-server's postinstall refuses to run as root without it.
  # ci: exactly the committed lock (install only when there is none).
  how=install
  if [ -f "$1/package-lock.json" ]; then how=ci; fi
  (cd "$1" && npm_config_yes=true npm_config_unsafe_perm=true npm "$how" --no-audit --no-fund --loglevel=error)
}

link "$here" tsc esbuild vsce eslint
if [ $ui = 1 ]; then link "$here/e2e" code-server; fi
