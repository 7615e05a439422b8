"""Incremental line splitting for adapters: output arrives in chunks that may split a line
(or a multi-byte character's text) anywhere, and a runaway line must not grow without bound.

``LineSplitter.feed(chunk)`` returns the lines completed by that chunk, without their line
ending (``\\n`` or ``\\r\\n``). A line longer than ``max_line`` characters is not kept: it is
reported once as an ``Overlong`` marker when its newline finally arrives, and its text is
dropped. ``partial`` is the text after the last newline, which interactive CLIs use for
prompts that wait on the same line.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_LINE = 1024 * 1024


@dataclass(frozen=True)
class Overlong:
    """A line longer than the cap; only its length is known."""

    length: int


class LineSplitter:
    """Splits a stream of text chunks into lines; O(total input) however it is chunked."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < 1:
            raise ValueError("max_line must be positive")
        self.max_line = max_line
        self._pieces: list[str] = []  # the unfinished line, in pieces (no re-joining per chunk)
        self._size = 0
        self._dropping = False  # the current line overflowed: discard until its newline
        self._dropped = 0
        self.offset = 0  # characters consumed so far; identifies positions in the stream

    def feed(self, text: str) -> list[str | Overlong]:
        out: list[str | Overlong] = []
        start = 0
        while True:
            end = text.find("\n", start)
            if end < 0:
                self._append(text[start:])
                break
            self._append(text[start:end])
            out.append(self._finish())
            start = end + 1
        self.offset += len(text)
        return out

    def skip(self, text: str) -> None:
        """Consume ``text`` without producing its complete lines (the caller knows none of
        them can matter); only the unfinished last line is kept, as ``feed`` would."""
        end = text.rfind("\n")
        if end >= 0:
            self._pieces, self._size = [], 0
            self._dropping, self._dropped = False, 0
            self._append(text[end + 1 :])
        else:
            self._append(text)
        self.offset += len(text)

    def flush(self) -> list[str | Overlong]:
        """The unfinished last line as a line (at end of stream), if there is one."""
        if not self._pieces and not self._dropping:
            return []
        return [self._finish()]

    @property
    def partial_size(self) -> int:
        """Length of ``partial`` without building it."""
        return 0 if self._dropping else self._size

    @property
    def partial(self) -> str:
        """The text after the last newline ('' while an overlong line is being dropped)."""
        if self._dropping:
            return ""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def _append(self, piece: str) -> None:
        if not piece:
            return
        if self._dropping:
            self._dropped += len(piece)
            return
        self._pieces.append(piece)
        self._size += len(piece)
        if self._size > self.max_line:
            self._dropping = True
            self._dropped = self._size
            self._pieces = []
            self._size = 0

    def _finish(self) -> str | Overlong:
        if self._dropping:
            marker = Overlong(self._dropped)
            self._dropping = False
            self._dropped = 0
            return marker
        line = "".join(self._pieces)
        self._pieces = []
        self._size = 0
        return line[:-1] if line.endswith("\r") else line
