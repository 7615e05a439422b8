"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel (the wheel
built from the sdist, so the sdist holds everything a build needs) without a setuptools
deprecation warning, and each installs into a clean virtual environment (no system
site-packages, nothing of this checkout on its path) where ``gridd --version`` and
``gridctl doctor`` run.

NETWORK AND TIME: this test downloads ``build``, setuptools and gridd's dependencies from
the configured package index (PyPI, or its mirror) into fresh environments; it takes about
one to three minutes and is skipped, saying so, when the index cannot be reached.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from gridd import __version__

ROOT = Path(__file__).resolve().parent.parent
#: Nothing of this checkout or of the test run leaks into the clean environments.
CLEAN_ENV = {
    key: value
    for key, value in os.environ.items()
    if key not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSAFEPATH"}
}

pytestmark = pytest.mark.timeout(600)


def run(argv: list[str | Path], *, cwd: Path, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(arg) for arg in argv],
        cwd=cwd,
        env=CLEAN_ENV,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{argv}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def clean_venv(path: Path) -> Path:
    """A virtual environment with pip and nothing else; its bin directory."""
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(path)
    return path / "bin"


def source_copy(into: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored), so that
    a build neither writes into the checkout nor picks up a local .venv or build/."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode & 0o777)
    return into


def test_build_makes_an_sdist_and_a_wheel_that_install_and_run_in_a_clean_venv(
    tmp_path: Path,
) -> None:
    tools = clean_venv(tmp_path / "tools")
    fetched = subprocess.run(
        [tools / "python", "-m", "pip", "install", "--quiet", "build>=1.2"],
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if fetched.returncode != 0:
        pytest.skip(f"the package index is not reachable: {fetched.stderr.strip()[-300:]}")

    source = source_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    built = run([tools / "python", "-m", "build", "--outdir", dist, source], cwd=source)
    assert "Warning" not in built and "deprecated" not in built, built
    (sdist,) = dist.glob(f"gridd-{__version__}.tar.gz")
    (wheel,) = dist.glob(f"gridd-{__version__}-py3-none-any.whl")

    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"gridd-{__version__}.dist-info/METADATA").decode()
    assert {"gridd/py.typed", "gridd/units/gridd@.service", "gridd/runs/example.py"} <= names
    assert f"gridd-{__version__}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: MIT" in metadata.splitlines()
    with tarfile.open(sdist) as tar:
        members = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "gridd/units/dev.gridd.plist"} <= members

    repo = tmp_path / "repo"
    repo.mkdir()
    run(["git", "init", "-q"], cwd=repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo)  # fmt: skip
    bin_dir = clean_venv(tmp_path / "venv")
    for artifact, how in ((wheel, []), (sdist, ["--force-reinstall", "--no-deps"])):
        # The sdist goes over the wheel's install, keeping the dependencies it brought.
        installed = run([bin_dir / "python", "-m", "pip", "install", *how, artifact], cwd=tmp_path)
        assert "deprecated" not in installed, installed
        # Run from a repository elsewhere: the installed package, not this checkout.
        assert run([bin_dir / "gridd", "--version"], cwd=repo).strip().endswith(__version__)
        where = run([bin_dir / "python", "-c", "import gridd; print(gridd.__file__)"], cwd=repo)
        assert where.startswith(str(bin_dir.parent)), where
        doctor = run([bin_dir / "gridctl", "doctor"], cwd=repo)
        assert "nothing needs action" in doctor, doctor
        assert f"agents.example.command: {bin_dir}/python" in doctor, doctor
