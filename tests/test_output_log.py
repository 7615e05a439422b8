"""An agent's output log and its index, read by the indexing monitor with its files kept
open between looks (within a share of the descriptor limit), or opened per look past it:
the same chunks either way, each indexed once, in order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gridd.runs import output
from gridd.runs.output import OutputLog


def _write(run: Path, text: str) -> None:
    with (run / "output.log").open("a") as fh:
        fh.write(text)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("keepable", [0, 1, 100])
def test_output_is_indexed_once_and_in_order_with_files_kept_open_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keepable: int
) -> None:
    monkeypatch.setattr(output._Kept, "left", keepable)
    log = OutputLog(tmp_path)
    assert log.poll() == []  # no output.log yet
    seen = []
    for n in range(50):
        _write(tmp_path, f"line {n}\n")
        seen += log.poll()
    assert [c.seq for c in seen] == list(range(1, 51))
    assert "".join(c.text for c in seen) == "".join(f"line {n}\n" for n in range(50))
    # A new reader (a daemon restarted) sees the same index, and nothing left to read.
    again = OutputLog(tmp_path)
    assert again.seq == 50 and again.poll() == []
    assert [c.text for c in again.read_since(48)] == ["line 48\n", "line 49\n"]
    log.close()
    again.close()
    assert output._Kept.left == keepable  # every descriptor kept was given back


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts /proc/self/fd")
def test_runs_keep_no_more_descriptors_open_than_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output._Kept, "left", 3)
    before = _open_fds()
    logs = []
    for i in range(4):
        run = tmp_path / f"r{i}"
        run.mkdir()
        _write(run, "hello\n")
        logs.append(OutputLog(run))
        assert [c.text for c in logs[-1].poll()] == ["hello\n"]
    # The first run keeps both of its files, the second only its log; the rest open per look.
    assert _open_fds() - before == 3 and output._Kept.left == 0
    for log in logs:
        log.close()
    assert _open_fds() == before and output._Kept.left == 3
