"""The editor tests' setup (contrib/vscode/scripts/setup.sh) on a fresh machine: native npm
modules build against the system's Node headers (never a download from nodejs.org), and a
user who is not root and has no chromium gets the UI tests left out with one line saying what
to install, while the rest is installed.

The script runs for real on a copy of the extension's package files, with `npm` and `id`
replaced by recorders on PATH, so nothing is downloaded and the real checkout is untouched.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "contrib" / "vscode"

FAKE_NPM = """#!/bin/sh
# Records each install's directory and native-build environment, then provides the binaries.
echo "$(pwd) nodedir=${npm_config_nodedir:-unset}" >> "$NPM_LOG"
mkdir -p node_modules/.bin
for b in tsc esbuild vsce code-server; do
  printf '#!/bin/sh\\n' > node_modules/.bin/$b; chmod +x node_modules/.bin/$b
done
"""

FAKE_ID = """#!/bin/sh
echo 1000
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.skipif(shutil.which("node") is None, reason="setup.sh needs node")
def test_setup_without_root_or_chromium_skips_only_the_ui_and_builds_against_system_headers(
    tmp_path: Path,
) -> None:
    ext = tmp_path / "vscode"
    (ext / "scripts").mkdir(parents=True)
    (ext / "e2e").mkdir()
    shutil.copy(EXT / "scripts" / "setup.sh", ext / "scripts" / "setup.sh")
    shutil.copy(EXT / "package.json", ext / "package.json")
    shutil.copy(EXT / "e2e" / "package.json", ext / "e2e" / "package.json")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "npm", FAKE_NPM)
    _executable(bin_dir / "id", FAKE_ID)
    log = tmp_path / "npm.log"
    env = {
        key: value for key, value in os.environ.items() if not key.lower().startswith("npm_config")
    }
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
        "HOME": str(tmp_path / "home"),
        "GRIDD_VSCODE_CACHE": str(tmp_path / "cache"),
        "GRIDD_CHROMIUM": str(tmp_path / "no-chromium"),
        "NPM_LOG": str(log),
    }

    done = subprocess.run(
        ["sh", str(ext / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(said) == 1, done.stderr
    assert "UI tests will be skipped" in said[0]
    assert "apt-get install chromium libkrb5-dev" in said[0]
    installs = log.read_text().splitlines()
    assert len(installs) == 1, installs  # the extension's own tools; not code-server
    assert (ext / "node_modules" / ".bin" / "tsc").exists()
    assert not (ext / "e2e" / "node_modules").exists()
    headers = Path("/usr/include/node/node.h").is_file()
    assert installs[0].endswith("nodedir=/usr" if headers else "nodedir=unset"), installs
