"""The VS Code extension (contrib/vscode): its unit tests, type check, packaging and its
end-to-end tests in a real VS Code (code-server + chromium) against a real gridd.

``contrib/vscode/scripts/setup.sh`` installs what these need (apt chromium, the pinned npm
packages) and skips what is already there; ``make test`` runs it first, and the fixture
runs it again (a no-op then) so ``pytest`` alone works too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "contrib" / "vscode"
OUTPUT = EXT / "test-output"

pytestmark = pytest.mark.xdist_group("vscode")


def _run(args: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


UI_SKIPPED = "setup: the editor's UI tests will be skipped"


@pytest.fixture(scope="module")
def setup_output() -> str:
    """setup.sh's stderr: it installs what the tests need, or says what it left out."""
    if shutil.which("npm") is None:
        pytest.skip("the VS Code extension's tests need node and npm")
    setup = _run(["sh", str(EXT / "scripts" / "setup.sh")], cwd=EXT, timeout=900)
    assert setup.returncode == 0, f"setup failed:\n{setup.stdout}\n{setup.stderr}"
    return setup.stderr


@pytest.fixture(scope="module")
def extension(setup_output: str) -> Iterator[Path]:
    """The extension with its dev dependencies installed and its bundle built."""
    build = _run(["npm", "run", "-s", "build"], cwd=EXT, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    yield EXT


@pytest.fixture(scope="module")
def code_server(extension: Path, setup_output: str) -> Path:
    """code-server, installed by setup.sh unless it said why not (no root, no chromium):
    then the UI tests are skipped with that line, never passed."""
    binary = extension / "e2e" / "node_modules" / ".bin" / "code-server"
    if not binary.exists():
        said = [line for line in setup_output.splitlines() if line.startswith(UI_SKIPPED)]
        assert said, f"setup.sh left out code-server without saying why:\n{setup_output}"
        pytest.skip(said[0].removeprefix("setup: "))
    return binary


@pytest.mark.timeout(300)
def test_client_unit_tests_pass_under_node_test_runner(extension: Path) -> None:
    result = _run(["npm", "test", "--silent"], cwd=extension, timeout=240)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "# fail 0" in result.stdout


@pytest.mark.parametrize("folder", [".", "e2e"])
def test_committed_lock_pins_exactly_the_declared_dev_dependencies_from_npm(folder: str) -> None:
    """``npm ci`` (setup.sh, a fresh clone) installs from the committed lock: it must exist,
    declare the same devDependencies as package.json, and fetch only from the npm registry."""
    base = EXT / folder
    declared = json.loads((base / "package.json").read_text())["devDependencies"]
    lock = json.loads((base / "package-lock.json").read_text())
    assert lock["packages"][""]["devDependencies"] == declared
    for name in declared:
        assert lock["packages"][f"node_modules/{name}"]["version"] == declared[name]
    installed = {k: p for k, p in lock["packages"].items() if k and not p.get("link")}
    # Every tarball checked by its hash; any recorded address is the npm registry's (npm
    # omits registry addresses under omit-lockfile-registry-resolved: then it is the default).
    assert all(p.get("integrity", "").startswith("sha512-") for p in installed.values())
    assert all(
        p["resolved"].startswith("https://registry.npmjs.org/")
        for p in installed.values()
        if "resolved" in p
    )


@pytest.mark.timeout(300)
def test_extension_is_strict_typescript_without_type_errors(extension: Path) -> None:
    """``npm run lint``: tsc --noEmit and ESLint with typescript-eslint's strict rules."""
    result = _run(["npm", "run", "-s", "lint"], cwd=extension, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_npm_run_package_builds_an_installable_vsix(extension: Path, code_server: Path) -> None:
    shutil.rmtree(extension / "build", ignore_errors=True)  # as in a fresh clone
    vsix = extension / "build" / "gridd-vscode.vsix"
    result = _run(["npm", "run", "-s", "package"], cwd=extension, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    with zipfile.ZipFile(vsix) as z:
        names = set(z.namelist())
        manifest = z.read("extension/package.json").decode()
    assert {"extension/dist/extension.js", "extension.vsixmanifest"} <= names
    assert not any("node_modules" in n or n.endswith(".ts") for n in names)
    assert '"gridd.tasks"' in manifest
    # Installable offline: code-server's own --install-extension, in a throwaway profile.
    home = Path(tempfile.mkdtemp(prefix="gvsix"))
    try:
        env = {
            **os.environ,
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local/share"),
            "EXTENSIONS_GALLERY": "{}",
        }
        installed = subprocess.run(
            [
                str(code_server),
                *("--install-extension", str(vsix)),
                *("--extensions-dir", str(home / "exts"), "--user-data-dir", str(home / "data")),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
        )
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert (home / "exts" / "gridd.gridd-vscode-0.1.0" / "dist" / "extension.js").is_file()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _e2e(extension: Path, suite: str) -> None:
    """Run one e2e suite; scenarios that wait for a missing gridd endpoint are reported as
    a skip naming it, never as a pass."""
    env = {
        **os.environ,
        "GRIDD_PYTHON": sys.executable,
        "GRIDD_REPO": str(ROOT),
        "GRIDD_E2E_OUT": str(OUTPUT / suite),
    }
    result = subprocess.run(
        ["node", str(extension / "e2e" / "run.js"), suite],
        cwd=extension / "e2e",
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        env=env,
    )
    tail = result.stdout[-12000:] + "\n" + result.stderr[-4000:]
    assert result.returncode == 0, tail
    summary = re.search(r"(\d+) passed, (\d+) failed, (\d+) skipped", result.stdout)
    assert summary is not None, tail
    passed, failed, skipped = (int(g) for g in summary.groups())
    assert failed == 0 and passed > 0, tail
    if skipped:
        reasons = re.findall(r"^skipped: (.*)$", result.stdout, re.MULTILINE)
        pytest.skip(f"{suite}: {passed} scenarios passed; waiting: {'; '.join(reasons)}")


@pytest.mark.timeout(420)
def test_e2e_ui_in_code_server_against_a_real_gridd(extension: Path, code_server: Path) -> None:
    """Tree from the snapshot, session from the palette, live output, question answered
    from the notification, diff, approve -> dependant starts, reject with feedback, and a
    killed then restarted gridd shown as "not connected" then reconnected."""
    _e2e(extension, "ui")


@pytest.mark.timeout(420)
def test_e2e_in_extension_host_against_a_real_gridd(extension: Path, code_server: Path) -> None:
    """The real vscode API in code-server's extension host: snapshot, session, output,
    follow-up, question answered elsewhere, error mapping, no event or output chunk lost
    across a gridd kill and restart, diff tabs, reject."""
    _e2e(extension, "inhost")
