"""How ``gridctl`` shows things to people: the console, wire data parsed, money, time, and
tables that fit the terminal (or are tab-separated in a pipe).

Pure formatting: every function takes wire data (already fetched) and returns text or rich
renderables, so it can be tested without a daemon and reused by later subcommands. Each
thing shown has its own module on top of this one: ``render_status`` (the status screen),
``render_agents``, ``render_questions``, ``render_events`` and ``render_tasks`` (tasks and
plan waves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from gridd.errors import GriddError
from gridd.model import RepoState, utcnow

_ELLIPSIS = "…"
_Model = TypeVar("_Model", bound=BaseModel)


def console() -> Console:
    """The console a command prints to. On a terminal, rich's; anywhere else nothing is
    wrapped or cut at a width (a log or a script reads whole lines), and tables are
    tab-separated (``FittedTable``)."""
    out = Console(highlight=False)
    if not out.is_terminal:
        out.soft_wrap = True
    return out


def parse_wire(model: type[_Model], data: Any, *, what: str | None = None) -> _Model:
    """Validate one wire document; a malformed answer is a GriddError, not a traceback."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        noun = model.__name__.lower()
        name = what or f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"
        raise GriddError(
            f"the daemon sent {name} this gridctl does not understand: {exc.errors()[0]['msg']}",
            code="bad_response",
        ) from None


def parse_state(data: Any) -> RepoState:
    """Validate ``GET /state``."""
    return parse_wire(RepoState, data, what="a /state")


def duration(seconds: float) -> str:
    """``3725.2`` -> ``1h 2m 5s``."""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{days}d" if days else "",
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
    ]
    return " ".join(p for p in [*parts, f"{secs}s"] if p)


def ago(when: datetime, *, now: datetime | None = None) -> str:
    """``2m 5s ago`` (a clock a little ahead of ours reads as ``0s ago``)."""
    seconds = ((now or utcnow()) - when).total_seconds()
    return f"{duration(max(seconds, 0.0))} ago"


def brief(seconds: float) -> str:
    """Two units at most, for "how long has it waited": ``45s``, ``3m``, ``2h 5m``, ``1d 3h``."""
    total = max(int(seconds), 0)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m"
    if total < 86400:
        hours, minutes = divmod(total // 60, 60)
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(total // 3600, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def waited(since: datetime, *, now: datetime | None = None) -> str:
    """How long since ``since``, briefly (a clock a little ahead of ours reads as ``0s``)."""
    return brief(((now or utcnow()) - since).total_seconds())


def money(usd: float | None) -> str:
    """``3.2`` -> ``$3.20``; fractions of a cent keep their digits; None -> ``-``."""
    if usd is None:
        return "-"
    if 0 < abs(usd) < 0.01:
        return f"${usd:.4f}"
    return f"${usd:,.2f}"


def clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + _ELLIPSIS


def plain_texts(*cells: str) -> list[Text]:
    # Agent output and questions may contain "[...]": never let rich read them as markup.
    return [Text(cell) for cell in cells]


def resume_text(when: datetime, *, now: datetime | None = None) -> str:
    """When a parked task resumes: ``14:05:00 (in 12m)`` in local time."""
    left = (when - (now or utcnow())).total_seconds()
    local = when.astimezone()
    stamp = f"{local:%H:%M:%S}" if left < 20 * 3600 else f"{local:%Y-%m-%d %H:%M}"
    return f"{stamp} (in {brief(left)})" if left > 0 else f"{stamp} (due)"


def plain_cell(text: str) -> str:
    """A cell of a tab-separated line: tabs and line breaks become spaces."""
    return " ".join(text.replace("\t", " ").splitlines()) if text else ""


class FittedTable:
    """A table laid out for where it is printed.

    On a terminal, when its columns do not all fit, those in ``give_way`` are left out, in
    that order, until the rest do; the columns kept show their cells whole, except those
    in ``wrapped`` (name -> width), which wrap there. When even those do not fit, each row
    becomes a block of ``column  value`` lines instead of a row of words wrapped one per line.

    Anywhere else (a pipe, a file, a CI log) it is plain text: a header line of the column
    names, then one line per row, the cells separated by tabs, every column, no title and
    no decoration (``gridctl task list | cut -f1``). With ``titled`` (a table inside a larger
    view, ``gridctl status``) the title, or ``empty``, comes first."""

    def __init__(
        self,
        title: str,
        columns: Sequence[str],
        rows: Sequence[Mapping[str, Text]],
        *,
        give_way: Sequence[str],
        wrapped: Mapping[str, int] | None = None,
        right: Sequence[str] = (),
        empty: str = "",
        titled: bool = False,
    ) -> None:
        self.title, self.names, self.rows = title, list(columns), rows
        self.give_way, self.wrapped, self.right = give_way, dict(wrapped or {}), set(right)
        self.empty, self.titled = empty, titled
        self._widths: dict[str, int] = {}

    def width_of(self, name: str) -> int:
        """The column's widest cell (or its wrap width), measured once per table: the
        layout asks for each column's width once per column that gives way, and a live
        view renders the same table again at every refresh."""
        if name not in self._widths:
            widest = max([len(name), *(row[name].cell_len for row in self.rows)])
            self._widths[name] = min(widest, self.wrapped.get(name, widest))
        return self._widths[name]

    def _needed(self, names: Sequence[str]) -> int:
        # Each column takes its widest cell, a space either side and one border.
        return sum(self.width_of(n) + 3 for n in names) + 1

    def columns(self, max_width: int) -> list[str]:
        """The columns shown in ``max_width`` cells: all, or all but those that gave way."""
        shown = list(self.names)
        for name in self.give_way:
            if self._needed(shown) <= max_width:
                break
            shown.remove(name)
        return shown

    def plain_lines(self) -> list[str]:
        """The tab-separated form: the header, then one line per row."""
        lines = ["\t".join(self.names)]
        lines += [
            "\t".join(plain_cell(row[name].plain) for name in self.names) for row in self.rows
        ]
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not options.is_terminal:
            if self.titled:
                yield Text(self.title if self.rows else self.empty)
            if self.rows or not self.titled:
                # Segments, not Text: a line is never wrapped at the console's width.
                for line in self.plain_lines():
                    yield Segment(line)
                    yield Segment.line()
            return
        if not self.rows:
            yield Text(self.empty, style="dim")
            return
        shown = self.columns(options.max_width)
        if self._needed(shown) > options.max_width:
            yield from self._blocks()
            return
        table = Table(title=self.title, title_justify="left")
        for name in shown:
            wraps = name in self.wrapped
            table.add_column(
                name,
                no_wrap=not wraps,
                min_width=len(name) if wraps else self.width_of(name),
                justify="right" if name in self.right else "left",
            )
        for row in self.rows:
            table.add_row(*(row[name] for name in shown))
        yield table

    def _blocks(self) -> RenderResult:
        """One block per row, every column: for a width no table fits in."""
        yield Text(self.title, style="italic")
        for row in self.rows:
            block = Table.grid(padding=(0, 2))
            block.add_column(style="bold", no_wrap=True)
            block.add_column()
            for name in self.names:
                block.add_row(name, row[name])
            yield Text("")
            yield block
