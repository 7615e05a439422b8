#!/bin/sh
# Install the pinned Claude Code CLI (tests/tools/claude-code/package.json) under
# .cache/claude-code/ with npm, for the end-to-end tests. Skips when that exact version is
# already there. Nothing but the npm registry is contacted.
#
# The native binary comes in the platform package (@anthropic-ai/claude-code-linux-x64,
# pinned beside the wrapper); the tests run it directly:
#   .cache/claude-code/node_modules/@anthropic-ai/claude-code-linux-x64/claude
# The wrapper's postinstall (install.cjs) only copies that binary over bin/claude.exe, so it
# is not needed and scripts are not run (--ignore-scripts).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="${GRIDD_CLAUDE_CACHE:-$root/.cache/claude-code}"
want=$(sed -n 's/.*"@anthropic-ai\/claude-code": "\([^"]*\)".*/\1/p' "$here/claude-code/package.json")
bin="$cache/node_modules/@anthropic-ai/claude-code-linux-x64/claude"
stamp="$cache/.installed-$want"

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "install-claude: only linux-x64 is pinned; the real-CLI tests will be skipped" >&2
    exit 0
fi
if [ -f "$stamp" ] && [ -x "$bin" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "install-claude: npm is not installed; the real-CLI tests will be skipped" >&2
    exit 0
fi
mkdir -p "$cache"
cp "$here/claude-code/package.json" "$cache/package.json"
echo "install-claude: installing @anthropic-ai/claude-code@$want into $cache" >&2
(cd "$cache" && npm install --no-audit --no-fund --ignore-scripts --no-save --loglevel=error)
version=$(HOME="$cache" DISABLE_AUTOUPDATER=1 "$bin" --version)
case "$version" in
    "$want "*) touch "$stamp" ;;
    *) echo "install-claude: expected $want, $bin says: $version" >&2; exit 1 ;;
esac
