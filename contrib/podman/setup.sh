#!/bin/sh
# Installs what the podman executor's tests need (tests/test_podman_runs.py), skipping what is
# already there: Debian's podman, runc (this VM's podman needs --runtime runc) and mmdebstrap
# (the box image is built from Debian packages: no image registry is needed). Without them and
# without root, only those tests are skipped (they say so); the rest runs. docs/executors.md.
set -eu
missing=""
for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "setup: the podman executor's tests will be skipped: they need$missing (as root: apt-get install -y podman runc mmdebstrap)" >&2
  exit 0
fi
# One installer at a time: checkouts share the machine's dpkg.
exec 9>/tmp/gridd-podman-setup.lock
flock 9
apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc mmdebstrap
