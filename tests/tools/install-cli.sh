#!/bin/sh
# Install one agent CLI for the real-CLI tests with npm, under a prefix of its own:
#
#   tests/tools/install-cli.sh NAME [VERSION] [PREFIX]
#
# NAME is a line of tests/tools/agent-clis.txt (claude, codex, gemini, opencode); VERSION
# defaults to that line's pin ("latest": the newest on npm); PREFIX defaults to
# .cache/clis/NAME (what the tests run; $GRIDD_AGENT_CLIS moves the whole tree). Skips when
# that exact version is there already. Nothing but the npm registry is contacted.
#
# The native programs come in their platform packages (claude, codex, opencode: linux-x64
# only), installed beside the wrapper; the tests run them directly, so no install script
# runs (--ignore-scripts). Gemini CLI is one bundled JavaScript file run with node (>= 20).
# The installed version is written to PREFIX/version.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
name=${1:?usage: install-cli.sh NAME [VERSION] [PREFIX]}
line=$(awk -v n="$name" '$1 == n' "$here/agent-clis.txt")
if [ -z "$line" ]; then
    echo "install-cli: no CLI named '$name' in tests/tools/agent-clis.txt" >&2
    exit 2
fi
set -- "$name" "${2:-}" "${3:-}" $line
package=$5
want=${2:-$6}
platform=$7
program=$8
prefix=${3:-${GRIDD_AGENT_CLIS:-$root/.cache/clis}/$name}

if [ "$platform" != "-" ] && [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "install-cli: $name is pinned for linux-x64 only; its real-CLI tests will be skipped" >&2
    exit 0
fi
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "install-cli: npm or node is not installed; the $name real-CLI tests will be skipped" >&2
    exit 0
fi
if [ "$want" = latest ]; then
    want=$(npm view "$package" version)
fi
if [ -f "$prefix/.installed-$want" ] && [ -e "$prefix/$program" ]; then
    exit 0
fi
deps="\"$package\": \"$want\""
if [ "$platform" != "-" ]; then
    spec=$(printf '%s' "$platform" | sed "s/{v}/$want/g")
    alias=$(printf '%s' "$spec" | sed 's/^\(@\{0,1\}[^@]*\)@.*/\1/')
    deps="$deps, \"$alias\": \"${spec#"$alias"@}\""
fi
mkdir -p "$prefix"
rm -f "$prefix"/.installed-*
printf '{"name": "gridd-test-%s", "private": true, "dependencies": {%s}}\n' "$name" "$deps" \
    > "$prefix/package.json"
echo "install-cli: installing $package@$want into $prefix" >&2
(cd "$prefix" && npm install --no-audit --no-fund --no-update-notifier --ignore-scripts \
    --omit=optional --no-save --loglevel=error)
case "$program" in
    *.js) said=$(HOME="$prefix" node "$prefix/$program" --version) ;;
    *) said=$(HOME="$prefix" DISABLE_AUTOUPDATER=1 "$prefix/$program" --version) ;;
esac
case " $said " in
    *" $want "*) ;;
    *) echo "install-cli: expected $name $want, $prefix/$program says: $said" >&2; exit 1 ;;
esac
echo "$want" > "$prefix/version"
touch "$prefix/.installed-$want"
