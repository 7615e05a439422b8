"""The heartbeat adapter skips line-splitting for output that cannot hold a usage-limit
notice; the notice must still be found however the output is chunked around it."""

from __future__ import annotations

from gridd.adapters.base import RateLimited
from gridd.adapters.heartbeat import HeartbeatAdapter

NOTICE = "Claude AI usage limit reached|1767225600"


def test_a_notice_is_found_at_every_split_point_after_plain_output() -> None:
    stream = "building...\nok\n" * 50 + "partial line before " + "\n" + NOTICE + "\nmore\n"
    for cut in range(len(stream) - len(NOTICE) - 10, len(stream)):
        adapter = HeartbeatAdapter()
        signals = adapter.feed_output(stream[:cut]) + adapter.feed_output(stream[cut:])
        limited = [s for s in signals if isinstance(s, RateLimited)]
        assert [s.resets_at for s in limited] == [1767225600.0], cut


def test_a_notice_spread_over_many_small_chunks_is_found() -> None:
    adapter = HeartbeatAdapter()
    signals = []
    for ch in "noise\n" + NOTICE + "\n":
        signals += adapter.feed_output(ch)
    assert any(isinstance(s, RateLimited) for s in signals)


def test_plain_output_without_the_word_produces_nothing() -> None:
    adapter = HeartbeatAdapter()
    assert adapter.feed_output("x" * 100_000 + "\n" + "you hit the lim" + "\n") == []
