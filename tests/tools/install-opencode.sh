#!/bin/sh
# Install the pinned opencode CLI (tests/tools/opencode/package.json) under .cache/opencode/
# with npm, for the end-to-end tests. Skips when that exact version is already there. Nothing
# but the npm registry is contacted.
#
# The native binary comes in the platform package (opencode-linux-x64, pinned beside the
# wrapper); the tests run it directly:
#   .cache/opencode/node_modules/opencode-linux-x64/bin/opencode
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="${GRIDD_OPENCODE_CACHE:-$root/.cache/opencode}"
want=$(sed -n 's/.*"opencode-ai": "\([^"]*\)".*/\1/p' "$here/opencode/package.json")
bin="$cache/node_modules/opencode-linux-x64/bin/opencode"
stamp="$cache/.installed-$want"

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "install-opencode: only linux-x64 is pinned; the real-CLI tests will be skipped" >&2
    exit 0
fi
if [ -f "$stamp" ] && [ -x "$bin" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "install-opencode: npm is not installed; the real-CLI tests will be skipped" >&2
    exit 0
fi
mkdir -p "$cache"
cp "$here/opencode/package.json" "$cache/package.json"
echo "install-opencode: installing opencode-ai@$want into $cache" >&2
(cd "$cache" && npm install --no-audit --no-fund --ignore-scripts --omit=optional --no-save --loglevel=error)
version=$(HOME="$cache" "$bin" --version)
case "$version" in
    "$want") touch "$stamp" ;;
    *) echo "install-opencode: expected $want, $bin says: $version" >&2; exit 1 ;;
esac
