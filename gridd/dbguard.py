"""Guards against silent state loss: the checks around the SQLite files that SQLite itself
does not make, because for SQLite an empty file is a valid empty database and a torn WAL
is just a shorter one.

- The **identity marker** ``gridd.db.id`` (beside the database) records the identity of the
  database gridd created there. A marker without its database, or with a 0-byte one, means
  data was there and is gone: gridd reports it rather than start empty as if nothing
  happened.
- The **WAL check** reads the write-ahead log's frames and checksums before SQLite opens
  it. Frames that carry the log's salt but fail their checksum are committed data SQLite
  would silently drop: the WAL is copied aside first, and the loss is reported.
- A database or WAL unlinked or replaced under a running daemon is ``walguard``'s.

Nothing here deletes a file: what is bad is moved or copied to ``<name>.corrupt-<ts>``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gridd.errors import StoreError

WAL_MAGIC = (0x377F0682, 0x377F0683)
WAL_HEADER = 32
FRAME_HEADER = 24


@dataclass(frozen=True)
class Problem:
    """Something found wrong with the state files, for the daemon to announce."""

    kind: str  # db_empty, db_missing, db_replaced, wal_garbled, db_unlinked, row_unreadable
    message: str
    moved_to: tuple[str, ...] = ()

    def wire(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "movedTo": list(self.moved_to)}


def aside_name(path: Path) -> Path:
    """A free ``<path>.corrupt-<UTC timestamp>[.n]`` beside ``path``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    candidate, n = Path(f"{path}.corrupt-{stamp}"), 1
    while candidate.exists():
        n += 1
        candidate = Path(f"{path}.corrupt-{stamp}.{n}")
    return candidate


# -- the identity marker --------------------------------------------------------------------


def marker_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".id")


def read_marker(db_path: Path) -> str | None:
    try:
        data = json.loads(marker_path(db_path).read_text())
    except (OSError, ValueError):
        return None
    identity = data.get("identity") if isinstance(data, dict) else None
    return identity if isinstance(identity, str) else None


def write_marker(db_path: Path, identity: str) -> None:
    path = marker_path(db_path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"identity": identity, "database": db_path.name}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def new_identity() -> str:
    return uuid.uuid4().hex


def check_before_open(db_path: Path) -> list[Problem]:
    """What is wrong with the files before SQLite touches them; bad files moved aside."""
    problems: list[Problem] = []
    marker = read_marker(db_path)
    try:
        size: int | None = db_path.stat().st_size
    except FileNotFoundError:
        size = None
    if marker is not None and size is None:
        problems.append(
            Problem(
                "db_missing",
                f"{db_path} is gone although gridd created a database there"
                f" (identity {marker}); starting with a new one: the old state is lost",
            )
        )
    elif marker is not None and size == 0 and not _has_wal_data(db_path):
        moved = aside_name(db_path)
        db_path.rename(moved)
        problems.append(
            Problem(
                "db_empty",
                f"{db_path} was 0 bytes although gridd had a database there (identity"
                f" {marker}); kept aside as {moved.name}, starting with a new one",
                (str(moved),),
            )
        )
    wal = Path(f"{db_path}-wal")
    garbled = wal_garbled(wal)
    if garbled is not None:
        copy = aside_name(wal)
        _copy_aside(wal, copy)
        problems.append(
            Problem(
                "wal_garbled",
                f"{wal.name} is damaged ({garbled}): changes after its last valid frame are"
                f" lost; a copy is kept as {copy.name}",
                (str(copy),),
            )
        )
    return problems


def _copy_aside(src: Path, copy: Path) -> None:
    """Copy ``src`` to ``copy``; on a disk with no room for it, leave no partial copy and
    refuse to go on (SQLite would drop the damaged frames the moment it opens the WAL)."""
    try:
        shutil.copy2(src, copy)
    except OSError as exc:
        copy.unlink(missing_ok=True)
        raise StoreError(
            f"{src.name} is damaged and there is no room to keep a copy of it before"
            f" opening the database ({exc.strerror}); free some space and start again",
            code="disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "store_error",
        ) from None


def _has_wal_data(db_path: Path) -> bool:
    try:
        return Path(f"{db_path}-wal").stat().st_size > WAL_HEADER
    except FileNotFoundError:
        return False


# -- the WAL check -----------------------------------------------------------------------------


def _checksum(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    fmt = ">" if big_endian else "<"
    words = struct.unpack(f"{fmt}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def wal_garbled(wal: Path) -> str | None:
    """Why the WAL at ``wal`` holds frames SQLite will drop, or None when it is sound.

    A frame of the current log (its salt matches the header's) whose checksum fails is
    damage; frames with another salt are leftovers of an earlier log and are fine.
    """
    try:
        data = wal.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if len(data) < WAL_HEADER:
        return None
    magic, _version, page_size, _ckpt, salt1, salt2, c0, c1 = struct.unpack(
        ">8I", data[:WAL_HEADER]
    )
    if magic not in WAL_MAGIC:
        return "bad header magic" if any(data[:WAL_HEADER]) else None
    big_endian = magic == WAL_MAGIC[1]
    if _checksum(data[:24], 0, 0, big_endian) != (c0, c1):
        return "header checksum mismatch"
    s0, s1 = c0, c1
    frame_size = FRAME_HEADER + page_size
    offset = WAL_HEADER
    while offset + frame_size <= len(data):
        head = data[offset : offset + FRAME_HEADER]
        _page, _commit, fs1, fs2, f0, f1 = struct.unpack(">6I", head)
        if (fs1, fs2) != (salt1, salt2):
            return None  # the rest belongs to an older log
        s0, s1 = _checksum(head[:8], s0, s1, big_endian)
        s0, s1 = _checksum(data[offset + FRAME_HEADER : offset + frame_size], s0, s1, big_endian)
        if (s0, s1) != (f0, f1):
            return f"frame {(offset - WAL_HEADER) // frame_size + 1} fails its checksum"
        offset += frame_size
    return None
