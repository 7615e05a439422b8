#!/bin/sh
# Install the pinned Gemini CLI (tests/tools/gemini-cli/package.json) under .cache/gemini-cli/
# with npm, for the end-to-end tests. Skips when that exact version is already there. Nothing
# but the npm registry is contacted. The CLI is one bundled JavaScript file run with node
# (>= 20); its optional native modules (a PTY, a keychain) are not needed headless.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="${GRIDD_GEMINI_CACHE:-$root/.cache/gemini-cli}"
want=$(sed -n 's/.*"@google\/gemini-cli": "\([^"]*\)".*/\1/p' "$here/gemini-cli/package.json")
bundle="$cache/node_modules/@google/gemini-cli/bundle/gemini.js"
stamp="$cache/.installed-$want"

if [ -f "$stamp" ] && [ -f "$bundle" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "install-gemini: npm or node is not installed; the real-CLI tests will be skipped" >&2
    exit 0
fi
mkdir -p "$cache"
cp "$here/gemini-cli/package.json" "$cache/package.json"
echo "install-gemini: installing @google/gemini-cli@$want into $cache" >&2
(cd "$cache" && npm install --no-audit --no-fund --ignore-scripts --omit=optional --no-save --loglevel=error)
version=$(node "$bundle" --version)
case "$version" in
    "$want") touch "$stamp" ;;
    *) echo "install-gemini: expected $want, $bundle says: $version" >&2; exit 1 ;;
esac
