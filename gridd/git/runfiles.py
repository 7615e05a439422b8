"""What a sandboxed run left in its own repository, read by the daemon as what it is: untrusted.

Every path below the run's repository may be a symbolic link, a FIFO, a device or a huge
file put there by the agent (or by a process it left behind). So nothing here follows a
link at any step (``openat`` from the repository down, ``O_NOFOLLOW``), waits on a FIFO
(``O_NONBLOCK``, regular files only), or reads more than a few KiB; objects are taken as
hard links of regular files only, never the run's ``objects/info`` (``git/private.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

_OBJECT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


def object_id(text: str) -> str:
    """The object id ``text`` starts with (sha1 or sha256, lower-case hex), or ""."""
    match = _OBJECT_ID.match(text.strip())
    return match.group(0) if match else ""


def read_small(path: Path, limit: int = 4096) -> str:
    """A small regular file's text, never following a link, never waiting on a FIFO or a
    device: what a run left may be anything. OSError for anything but a regular file."""
    return read_in(path.parent, path.name, limit=limit)


def read_in(top: Path, relative: str, *, limit: int = 4096) -> str:
    """``read_small`` of ``top/relative``, following no link at any step below ``top``
    (``refs/heads/grid`` made a link elsewhere leads nowhere)."""
    *dirs, name = relative.split("/")
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in dirs:
            below = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = below
        opened = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd
        )
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(opened).st_mode):
            raise OSError(f"{top / relative} is not a regular file")
        return os.read(opened, limit).decode(errors="replace")
    finally:
        os.close(opened)


def link_objects(repo: Path, view: Path) -> list[Path]:
    """Hard-link the run's own objects into ``view``'s: loose objects and pack files only
    (never its ``info/``: alternates, commit graphs), regular files only, no link followed.
    Returns the packs, whose indexes gridd makes itself (``git index-pack``)."""
    objects = repo / "objects"
    packs: list[Path] = []
    if not stat.S_ISDIR(os.lstat(objects).st_mode):
        return packs
    for entry in os.scandir(objects):
        loose = len(entry.name) == 2 and all(c in "0123456789abcdef" for c in entry.name)
        if not (loose or entry.name == "pack") or not entry.is_dir(follow_symlinks=False):
            continue
        for item in os.scandir(entry.path):
            if loose:
                wanted = _OBJECT_ID.fullmatch(entry.name + item.name) is not None
            else:
                wanted = item.name.startswith("pack-") and item.name.endswith(".pack")
            if not wanted or not item.is_file(follow_symlinks=False):
                continue
            target = view / "objects" / entry.name / item.name
            target.parent.mkdir(exist_ok=True)
            try:
                os.link(item.path, target, follow_symlinks=False)
            except OSError:  # another file system, or a link refused: a copy
                shutil.copyfile(item.path, target, follow_symlinks=False)
            if not loose:
                packs.append(target)
    return packs


def ref_of(repo: Path, ref: str) -> str:
    """The commit a run's repository names for ``ref`` as far as its files say ("" when
    they do not): its loose ref, which outranks a packed one, else its ``packed-refs``."""
    try:
        return object_id(read_in(repo, ref))
    except OSError:
        pass
    try:
        packed = read_small(repo / "packed-refs", limit=1 << 16)
    except OSError:
        return ""
    for line in packed.splitlines():
        sha, _, name = line.partition(" ")
        if name == ref:
            return object_id(sha)
    return ""


def merge_head(git_dir: Path) -> str:
    """The commit a merge in progress there merges (``MERGE_HEAD``), or ""."""
    try:
        return object_id(read_small(git_dir / "MERGE_HEAD"))
    except OSError:
        return ""
