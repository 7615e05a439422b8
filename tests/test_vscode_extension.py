"""The VS Code extension (contrib/vscode): its unit tests, type check, packaging and its
end-to-end tests in a real VS Code (code-server + chromium) against a real gridd.

``contrib/vscode/scripts/setup.sh`` installs what these need (apt chromium, the pinned npm
packages) and skips what is already there; ``make test`` runs it first, and the fixture
runs it again (a no-op then) so ``pytest`` alone works too.
"""

from __future__ import annotations

import shutil
import subprocess
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


@pytest.fixture(scope="module")
def extension() -> Iterator[Path]:
    """The extension with its dev dependencies installed and its bundle built."""
    if shutil.which("npm") is None:
        pytest.skip("the VS Code extension's tests need node and npm")
    setup = _run(["sh", str(EXT / "scripts" / "setup.sh")], cwd=EXT, timeout=900)
    assert setup.returncode == 0, f"setup failed:\n{setup.stdout}\n{setup.stderr}"
    build = _run(["npm", "run", "-s", "build"], cwd=EXT, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    yield EXT


@pytest.mark.timeout(300)
def test_client_unit_tests_pass_under_node_test_runner(extension: Path) -> None:
    result = _run(["npm", "test", "--silent"], cwd=extension, timeout=240)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "# fail 0" in result.stdout


@pytest.mark.timeout(300)
def test_extension_is_strict_typescript_without_type_errors(extension: Path) -> None:
    result = _run(["npm", "run", "-s", "lint"], cwd=extension, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_npm_run_package_builds_an_installable_vsix(extension: Path) -> None:
    vsix = extension / "build" / "gridd-vscode.vsix"
    vsix.unlink(missing_ok=True)
    result = _run(["npm", "run", "-s", "package"], cwd=extension, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    with zipfile.ZipFile(vsix) as z:
        names = set(z.namelist())
        manifest = z.read("extension/package.json").decode()
    assert {"extension/dist/extension.js", "extension.vsixmanifest"} <= names
    assert not any("node_modules" in n or n.endswith(".ts") for n in names)
    assert '"gridd.tasks"' in manifest
