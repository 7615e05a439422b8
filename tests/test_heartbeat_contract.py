"""The heartbeat contract: lenient parsing, incremental reads, and the pure health verdict."""

from __future__ import annotations

from pathlib import Path

from gridd.adapters.beat import Beat, HeartbeatReader, parse_beat
from gridd.liveness import Limits, Verdict, assess


def test_only_status_is_required_and_cost_is_read_when_numeric() -> None:
    beat = parse_beat('{"status":"working","label":"tests","message":"3/10","cost_usd":0.25}')
    assert isinstance(beat, Beat)
    assert (beat.status, beat.label, beat.message, beat.cost_usd) == (
        "working",
        "tests",
        "3/10",
        0.25,
    )
    assert isinstance(parse_beat('{"status":"working","cost_usd":"lots"}'), Beat)
    assert parse_beat('{"status":"working","cost_usd":"lots"}').cost_usd is None  # type: ignore[union-attr]


def test_malformed_lines_become_warnings_not_errors() -> None:
    for line in ("not json", "[1,2]", '{"label":"no status"}', '{"status":""}'):
        assert isinstance(parse_beat(line), str), line


def test_reader_returns_only_complete_lines_and_resumes_from_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "heartbeat.ndjson"
    reader = HeartbeatReader(path)
    assert reader.poll() == ([], [])  # no file yet
    path.write_text('{"status":"started"}\ngarbage\n{"status":"work')
    beats, warnings = reader.poll()
    assert [b.status for b in beats] == ["started"]
    assert len(warnings) == 1
    with path.open("a") as fh:
        fh.write('ing"}\n')
    beats, _ = reader.poll()
    assert [b.status for b in beats] == ["working"]
    again = HeartbeatReader(path, offset=reader.offset)
    assert again.poll() == ([], [])


def test_launch_failure_needs_no_life_at_all_within_the_grace() -> None:
    limits = Limits(launch_grace=10, stall=30, stall_kill=60)
    assert assess(now=5, started=0, last_life=None, limits=limits) is Verdict.OK
    assert assess(now=11, started=0, last_life=None, limits=limits) is Verdict.LAUNCH_FAILED
    assert assess(now=11, started=0, last_life=9, limits=limits) is Verdict.OK


def test_silence_is_first_a_stall_then_a_kill() -> None:
    limits = Limits(launch_grace=10, stall=30, stall_kill=60)
    assert assess(now=100, started=0, last_life=75, limits=limits) is Verdict.OK
    assert assess(now=100, started=0, last_life=65, limits=limits) is Verdict.STALLED
    assert assess(now=100, started=0, last_life=35, limits=limits) is Verdict.STALL_KILL
    unlimited = Limits(None, None, None)
    assert assess(now=1e9, started=0, last_life=None, limits=unlimited) is Verdict.OK
