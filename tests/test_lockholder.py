"""``gridd.lockholder.flock_holder`` reads the kernel's table of locks: the holder of an
``flock`` on the file asked about, never a waiter, another file's holder or an fcntl lock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gridd.lockholder import flock_holder


def device_of(path: Path) -> str:
    st = path.stat()
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def test_the_holder_is_the_flock_on_that_file_not_a_waiter_or_a_posix_lock(
    tmp_path: Path,
) -> None:
    lock, other = tmp_path / "gridd.lock", tmp_path / "other"
    lock.touch()
    other.touch()
    table = tmp_path / "locks"
    table.write_text(
        f"1: POSIX  ADVISORY  WRITE 11 {device_of(lock)} 0 EOF\n"
        f"2: FLOCK  ADVISORY  WRITE 22 {device_of(other)} 0 EOF\n"
        f"3: FLOCK  ADVISORY  WRITE 33 {device_of(lock)} 0 EOF\n"
        f"3: -> FLOCK  ADVISORY  WRITE 44 {device_of(lock)} 0 EOF\n"
    )
    assert flock_holder(lock, proc_locks=table) == 33
    assert flock_holder(other, proc_locks=table) == 22
    table.write_text(f"3: -> FLOCK  ADVISORY  WRITE 44 {device_of(lock)} 0 EOF\n")
    assert flock_holder(lock, proc_locks=table) is None
    # Held from another pid namespace: held, but the kernel shows no pid.
    table.write_text(f"1: FLOCK  ADVISORY  WRITE 0 {device_of(lock)} 0 EOF\n")
    assert flock_holder(lock, proc_locks=table) == 0


def test_it_says_it_cannot_tell_rather_than_that_no_one_holds_it(tmp_path: Path) -> None:
    lock = tmp_path / "gridd.lock"
    lock.touch()
    with pytest.raises(OSError):
        flock_holder(lock, proc_locks=tmp_path / "no-such-table")  # not Linux
    with pytest.raises(OSError):
        flock_holder(tmp_path / "gone", proc_locks=tmp_path / "no-such-table")
