"""An agent's output: ``output.log`` (raw bytes) plus ``chunks.idx`` (where each chunk is).

Chunk ``seq`` n (1-based) is record n of the index: 16 bytes, offset and length. The index
is the daemon's; the log is the shim's. After a daemon restart, whatever the agent wrote in
the meantime is simply the unindexed tail of the log, so sequence numbers continue with no
gap and no duplicate.

The indexing monitor keeps both files open between looks (``poll``): with hundreds of agents
each printing, opening and closing them for every line was a fifth of the daemon's work. The
descriptors kept open by all runs together stay under a quarter of the process's limit
(``RLIMIT_NOFILE``); past that a run opens its files per look, as before.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

_RECORD = struct.Struct("<QQ")
MAX_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Chunk:
    seq: int
    text: str


def _utf8_cut(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not split a UTF-8 character."""
    end = len(data)
    i = end - 1
    while i >= 0 and end - i < 4 and data[i] & 0xC0 == 0x80:
        i -= 1  # continuation bytes: walk back to the lead byte
    if i < 0 or data[i] < 0xC0:
        return end  # ASCII, or not UTF-8 at all: nothing to hold back
    lead = data[i]
    need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return end if end - i >= need else i


_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


def _append(path: str, data: bytes) -> None:
    """Append ``data`` whole (as ``open(path, "ab")`` would, without the file object)."""
    fd = os.open(path, _APPEND_FLAGS, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class _Kept:
    """How many more descriptors runs may keep open between looks (a quarter of the
    process's limit, counted once it is first asked)."""

    left: int | None = None

    @classmethod
    def take(cls) -> bool:
        if cls.left is None:
            cls.left = _keepable()
        if cls.left <= 0:
            return False
        cls.left -= 1
        return True

    @classmethod
    def give_back(cls) -> None:
        if cls.left is not None:
            cls.left += 1


def _keepable() -> int:
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 0
    if soft < 0:  # RLIM_INFINITY
        soft = 1 << 16
    return soft // 4


class OutputLog:
    def __init__(self, run_dir: Path, *, writer: bool = True) -> None:
        """``writer``: the one monitor that indexes new output (and may repair the index);
        readers (the output endpoint) only look."""
        self.log_path = run_dir / "output.log"
        self.idx_path = run_dir / "chunks.idx"
        # As strings: ``poll`` runs once per line an agent prints, and a Path costs there.
        self._log = str(self.log_path)
        self._idx = str(self.idx_path)
        self.seq = 0
        self.offset = 0
        #: The log (read) and the index (append) kept open between looks, when allowed.
        self._log_fd: int | None = None
        self._idx_fd: int | None = None
        try:
            size = os.stat(self.idx_path).st_size
        except FileNotFoundError:
            return
        usable = size - size % _RECORD.size  # a torn last record is dropped
        if usable != size and writer:
            with self.idx_path.open("r+b") as fh:
                fh.truncate(usable)
        self.seq = usable // _RECORD.size
        if self.seq:
            with self.idx_path.open("rb") as fh:
                fh.seek(usable - _RECORD.size)
                off, length = _RECORD.unpack(fh.read(_RECORD.size))
            self.offset = off + length

    def size(self) -> int:
        try:
            return os.stat(self._log).st_size
        except FileNotFoundError:
            return 0

    def poll(self, *, max_chunks: int = 16, final: bool = False) -> list[Chunk]:
        """Index and return new output (at most ``max_chunks`` chunks). Plain descriptor
        calls (``fstat``, ``pread``, an ``O_APPEND`` write) on descriptors kept open: this
        runs for every line agents print."""
        fd = self._log_fd
        kept = fd is not None
        if fd is None:
            try:
                fd = os.open(self._log, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return []
            if _Kept.take():
                self._log_fd, kept = fd, True
        try:
            size = os.fstat(fd).st_size
            if size <= self.offset:
                return []
            chunks: list[Chunk] = []
            records = bytearray()
            while len(chunks) < max_chunks and self.offset < size:
                data = os.pread(fd, min(MAX_CHUNK, size - self.offset), self.offset)
                if not data:
                    break
                # Only the very end of a finished run may split a character (it never
                # gets the rest); a cut inside the log waits for a whole character.
                at_end = self.offset + len(data) >= size
                cut = len(data) if final and at_end else _utf8_cut(data)
                if cut == 0:
                    break  # only a partial character so far; wait for the rest
                data = data[:cut]
                records += _RECORD.pack(self.offset, len(data))
                self.offset += len(data)
                self.seq += 1
                chunks.append(Chunk(self.seq, data.decode("utf-8", errors="replace")))
        finally:
            if not kept:
                os.close(fd)
        if records:
            self._append_index(bytes(records))
        return chunks

    def _append_index(self, records: bytes) -> None:
        fd = self._idx_fd
        if fd is None:
            if not _Kept.take():
                _append(self._idx, records)
                return
            try:
                fd = os.open(self._idx, _APPEND_FLAGS, 0o666)
            except BaseException:
                _Kept.give_back()
                raise
            self._idx_fd = fd
        view = memoryview(records)
        while view:
            view = view[os.write(fd, view) :]

    def close(self) -> None:
        """Close the descriptors kept between looks (the run is over; ``poll`` reopens)."""
        for name in ("_log_fd", "_idx_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                setattr(self, name, None)
                _Kept.give_back()
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit ``os`` may be gone already
            pass

    def skip_to(self, seq: int) -> None:
        """Append empty records up to ``seq`` (numbers a damaged index lost are not reused)."""
        if seq <= self.seq:
            return
        with self.idx_path.open("ab") as idx:
            idx.write(_RECORD.pack(self.offset, 0) * (seq - self.seq))
        self.seq = seq

    def read_since(self, since: int, *, limit: int = 1000) -> list[Chunk]:
        """Chunks with seq > ``since`` that are already indexed."""
        if since >= self.seq or not self.idx_path.exists():
            return []
        count = min(limit, self.seq - since)
        with self.idx_path.open("rb") as idx:
            idx.seek(since * _RECORD.size)
            raw = idx.read(count * _RECORD.size)
        out: list[Chunk] = []
        with self.log_path.open("rb") as fh:
            for i in range(len(raw) // _RECORD.size):
                off, length = _RECORD.unpack_from(raw, i * _RECORD.size)
                fh.seek(off)
                out.append(Chunk(since + i + 1, fh.read(length).decode("utf-8", errors="replace")))
        return out

    def tail_text(self, max_bytes: int = 4096) -> str:
        size = self.size()
        with self.log_path.open("rb") as fh:
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
