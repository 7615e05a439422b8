#!/bin/sh
# Install the pinned Codex CLI (tests/tools/codex/package.json) under .cache/codex/ with npm,
# for the end-to-end tests. Skips when that exact version is already there. Nothing but the
# npm registry is contacted.
#
# The native binary comes in the platform package (@openai/codex-linux-x64, an alias of
# @openai/codex@<version>-linux-x64, pinned beside the wrapper); the tests run it directly:
#   .cache/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="${GRIDD_CODEX_CACHE:-$root/.cache/codex}"
want=$(sed -n 's/.*"@openai\/codex": "\([^"]*\)".*/\1/p' "$here/codex/package.json")
bin="$cache/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
stamp="$cache/.installed-$want"

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "install-codex: only linux-x64 is pinned; the real-CLI tests will be skipped" >&2
    exit 0
fi
if [ -f "$stamp" ] && [ -x "$bin" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "install-codex: npm is not installed; the real-CLI tests will be skipped" >&2
    exit 0
fi
mkdir -p "$cache"
cp "$here/codex/package.json" "$cache/package.json"
echo "install-codex: installing @openai/codex@$want into $cache" >&2
(cd "$cache" && npm install --no-audit --no-fund --ignore-scripts --no-save --loglevel=error)
version=$("$bin" --version)
case "$version" in
    "codex-cli $want") touch "$stamp" ;;
    *) echo "install-codex: expected $want, $bin says: $version" >&2; exit 1 ;;
esac
