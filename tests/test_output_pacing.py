"""Output pacing (``gridd/pool/pacing.py``): a monitor publishes an agent's output no faster
than the event stream's readers take it, so a flood waits on disk, not in memory, and a
stalled reader never holds the others back. The decision is tested as a pure function, the
pacer on a fake backlog, and the whole on an in-process daemon with a real flooding agent
and a slow reader over the socket: every byte arrives, in order, with the queues bounded."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import cast

import httpx

from gridd import memory
from gridd.client import SSEParser
from gridd.grid import Grid
from gridd.pool.pacing import HIGH_BYTES, OutputPacer, Verdict, verdict
from tests.agents.flood import LINE
from tests.support.daemons import inprocess_daemon
from tests.support.repos import agent_command

MIB = 1024 * 1024


def test_the_pace_waits_for_readers_that_progress_and_not_for_a_stalled_one() -> None:
    def judge(held: int, lowest: int, since: float, now: float) -> Verdict:
        return verdict(held=held, high=100, lowest=lowest, since=since, now=now, patience=0.5)

    assert judge(100, 500, 0.0, 9.0) is Verdict.GO  # under the mark
    assert judge(400, 500, 0.0, 9.0) is Verdict.WAIT  # a new low: readers are taking it
    assert judge(500, 500, 0.0, 0.4) is Verdict.WAIT  # no progress yet, still patient
    assert judge(600, 500, 0.0, 0.5) is Verdict.STALLED  # nothing moved for 0.5 s


async def test_the_pacer_holds_a_watcher_until_the_backlog_drains() -> None:
    backlog = [10 * MIB]

    def held() -> int:
        backlog[0] = max(0, backlog[0] - MIB)  # a reader taking 1 MiB per look
        return backlog[0]

    pacer = OutputPacer(held=held, high=4 * MIB, patience=0.2, step=0.001)
    await pacer.settle()
    assert backlog[0] <= 4 * MIB and pacer.waits == 1 and not pacer.stalled


async def test_the_pacer_gives_up_on_a_stalled_reader_until_the_backlog_is_back_down() -> None:
    backlog = [10 * MIB]
    pacer = OutputPacer(held=lambda: backlog[0], high=4 * MIB, patience=0.05, step=0.001)
    began = time.monotonic()
    await pacer.settle()
    assert pacer.stalled and 0.05 <= time.monotonic() - began < 1.0
    began = time.monotonic()
    await pacer.settle()  # no second wait for the same stalled reader
    assert time.monotonic() - began < 0.01 and pacer.waits == 1
    backlog[0] = MIB
    await pacer.settle()
    assert not pacer.stalled


async def test_a_flood_trims_the_heap_once_the_readers_have_taken_it() -> None:
    backlog = [MIB]
    pacer = OutputPacer(held=lambda: backlog[0])
    pacer.published(MIB)
    pacer.rest()
    await asyncio.sleep(0.01)
    assert pacer.trims == 0  # a little output is not a burst
    pacer.published(8 * MIB)
    pacer.rest()
    pacer.rest()  # (one trim pending at a time)
    await asyncio.sleep(0.01)
    assert pacer.trims == 0  # still queued for a reader: the memory is still in use
    backlog[0] = 0
    deadline = time.monotonic() + 5
    while pacer.trims == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert pacer.trims == 1 and pacer.unsettled == 0
    assert memory.trim() in (True, False)  # never raises, whatever the libc


class _SlowReader(threading.Thread):
    """``GET /events?types=agent.output`` on one connection, read at ``rate`` bytes/s."""

    def __init__(self, sock: Path, rate: float, want: int) -> None:
        super().__init__(daemon=True)
        self.sock, self.rate, self.want = sock, rate, want
        self.text: list[str] = []
        self.seqs: list[int] = []
        self.chars = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        transport = httpx.HTTPTransport(uds=str(self.sock))
        url = "/events?types=agent.output"
        try:
            with (
                httpx.Client(transport=transport, base_url="http://gridd") as http,
                http.stream("GET", url, timeout=httpx.Timeout(10, read=60)) as r,
            ):
                parser, got, t0 = SSEParser(), 0, time.monotonic()
                for line in r.iter_lines():
                    got += len(line) + 2
                    if (event := parser.feed_line(line)) is not None:
                        self.seqs.append(int(event.data["seq"]))
                        self.text.append(str(event.data["chunk"]))
                        self.chars += len(self.text[-1])
                        if self.chars >= self.want:
                            return
                    ahead = t0 + got / self.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
        except BaseException as exc:
            self.error = exc


async def test_a_flood_to_a_slow_reader_arrives_whole_while_the_queues_stay_bounded(
    repo: Path, tmp_path: Path
) -> None:
    megabytes = 8
    expected = (LINE * 1024 * 16 * megabytes).decode()
    config = {
        "agents": {"flood": {"command": agent_command("flood.py", str(megabytes), str(tmp_path))}},
        "scheduler": {"default_agent": "flood"},
    }
    async with inprocess_daemon(repo, config) as daemon:
        grid = cast(Grid, daemon.grid)
        reader = _SlowReader(daemon.sock, rate=4 * MIB, want=len(expected))
        reader.start()
        transport = httpx.AsyncHTTPTransport(uds=str(daemon.sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://gridd") as c:
            assert (await c.post("/tasks", json={"id": "flood", "title": "flood"})).is_success
            assert (await c.post("/tasks/flood/start")).is_success
            deadline = time.monotonic() + 60
            while reader.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        assert reader.error is None and not reader.is_alive()
        assert reader.seqs == list(range(1, len(reader.seqs) + 1))  # none lost, none reordered
        assert "".join(reader.text) == expected
        pacer = grid.pool.monitor.pacer
        assert pacer.waits > 0  # the monitor waited for the reader...
        # ... so the queues never held much more than the mark and one look (16 chunks,
        # JSON-escaped), where unpaced they held the flood (~10 MiB of JSON here).
        assert grid.bus.budget.peak <= HIGH_BYTES + 2 * MIB
        deadline = time.monotonic() + 15
        while pacer.trims == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert pacer.trims >= 1  # and the heap was trimmed once it was over


async def test_a_reader_that_keeps_taking_is_not_stalled_while_another_publisher_adds() -> None:
    # Two publishers wait on one pacer at once (the output pass and a finished run's
    # monitor): while one waits, the other's output keeps the backlog from a new low,
    # though the reader takes events all along. Taking is progress: no stall verdict.
    backlog, taken = [6 * MIB], [0]

    def held() -> int:
        taken[0] += 64 * 1024  # the reader takes a chunk per look...
        return backlog[0]  # ... and the other publisher adds as much meanwhile

    pacer = OutputPacer(held=held, taken=lambda: taken[0], high=4 * MIB, patience=0.05, step=0.001)
    waiting = asyncio.ensure_future(pacer.settle())
    await asyncio.sleep(0.2)  # four times the patience
    assert not waiting.done() and not pacer.stalled
    backlog[0] = 3 * MIB  # the other publisher is done; the reader catches up
    await asyncio.wait_for(waiting, 1)
    assert not pacer.stalled


def test_progress_is_a_new_low_or_events_taken() -> None:
    def judge(held: int, *, taken: bool) -> Verdict:
        return verdict(
            held=held, high=100, lowest=500, since=0.0, now=9.0, patience=0.5, taken=taken
        )

    assert judge(600, taken=True) is Verdict.WAIT  # no new low, but readers took events
    assert judge(600, taken=False) is Verdict.STALLED
