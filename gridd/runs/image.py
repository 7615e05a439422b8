"""The box image built from Debian packages: no image registry needed.

``mmdebstrap`` makes a root file system of the suite's essential packages plus the ones
asked for (git and Python are all the in-box shim needs), without documentation, man pages
or locales; ``podman import`` turns it into an image. Both are cached by the recipe's
content hash: the tarball under the user's cache directory, the image as
``localhost/gridd-box:<hash>``, so a recipe is built once per machine.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path

from gridd.runs.boxes import BoxError

log = logging.getLogger(__name__)

REPOSITORY = "localhost/gridd-box"
#: Left out of the root file system: nothing in a box reads them.
EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
)


def recipe(*, suite: str, packages: list[str]) -> list[str]:
    """The mmdebstrap argv, less the output path: what the cache hash covers."""
    argv = ["mmdebstrap", "--variant=essential", "--mode=root", "--format=tar", "--quiet"]
    if packages:
        argv.append("--include=" + ",".join(sorted(packages)))
    argv += [f"--dpkgopt=path-exclude={path}" for path in EXCLUDES]
    return [*argv, suite]


def image_tag(*, suite: str, packages: list[str]) -> str:
    digest = hashlib.sha256(json.dumps(recipe(suite=suite, packages=packages)).encode())
    return f"{REPOSITORY}:{digest.hexdigest()[:16]}"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gridd" / "images"


def ensure_image(podman: list[str], *, suite: str, packages: list[str], cache_dir: Path) -> str:
    """The image's tag, built (minutes, once) when podman does not have it yet."""
    tag = image_tag(suite=suite, packages=packages)
    if _exists(podman, tag):
        return tag
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per machine: the others wait for it
        if not _exists(podman, tag):
            _build(podman, tag, suite=suite, packages=packages, cache_dir=cache_dir)
    return tag


def _exists(podman: list[str], tag: str) -> bool:
    return subprocess.run([*podman, "image", "exists", tag], capture_output=True).returncode == 0


def _build(
    podman: list[str], tag: str, *, suite: str, packages: list[str], cache_dir: Path
) -> None:
    tarball = cache_dir / f"{tag.rsplit(':', 1)[1]}.tar"
    if not tarball.exists():
        log.info("building the box image %s with mmdebstrap (once)", tag)
        partial = tarball.with_suffix(".partial")
        argv = recipe(suite=suite, packages=packages)
        done = subprocess.run([*argv[:-1], argv[-1], str(partial)], capture_output=True)
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise BoxError(
                "could not build the box image with mmdebstrap:"
                f" {done.stderr.decode(errors='replace')[-800:]}",
                details={"image": tag},
            )
        partial.replace(tarball)
    done = subprocess.run([*podman, "import", str(tarball), tag], capture_output=True)
    if done.returncode != 0:
        raise BoxError(
            f"podman import failed: {done.stderr.decode(errors='replace')[-500:]}",
            details={"image": tag},
        )
