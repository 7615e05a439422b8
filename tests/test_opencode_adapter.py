"""The opencode adapter (gridd/adapters/opencode.py), pure: transcripts captured from the
real CLI (opencode-ai 1.18.33, ``tests/transcripts/opencode-real-*.jsonl``) become the same
signals however they are chunked; a 429 it gives up on is parked to its headers' reset."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gridd.adapters.base import (
    Cost,
    Malformed,
    RateLimited,
    Result,
    SessionId,
    Signal,
    ToolUse,
    Usage,
)
from gridd.adapters.opencode import OpencodeAdapter
from gridd.adapters.registry import get_adapter
from gridd.errors import ConfigError
from gridd.settings import builtin_profiles

TRANSCRIPTS = Path(__file__).parent / "transcripts"


def run(text: str, *, step: int | None = None) -> tuple[OpencodeAdapter, list[Signal]]:
    adapter = OpencodeAdapter()
    pieces = [text] if step is None else [text[i : i + step] for i in range(0, len(text), step)]
    signals = [s for piece in pieces for s in adapter.feed_output(piece)]
    return adapter, signals + adapter.feed_eof()


def transcript(name: str) -> str:
    return (TRANSCRIPTS / f"opencode-real-{name}.jsonl").read_text()


def of(kind: type, signals: list[Signal]) -> list[Signal]:
    return [s for s in signals if isinstance(s, kind)]


@pytest.mark.parametrize("step", [None, 1, 29])
def test_a_written_file_gives_the_session_the_tool_and_opencodes_own_cost_once(
    step: int | None,
) -> None:
    adapter, signals = run(transcript("write"), step=step)
    [session] = of(SessionId, signals)
    assert isinstance(session, SessionId) and session.value.startswith("ses_")
    assert of(ToolUse, signals) == [ToolUse(None)]  # the json output shows it completed
    assert of(Usage, signals)[-1] == Usage(50, 24)
    costs = of(Cost, signals)
    assert isinstance(costs[-1], Cost)
    assert costs[-1].usd == pytest.approx(2 * 0.000255)  # the steps' costs, added once
    assert of(Result, signals) == [Result(ok=True, text="Done.", subtype="stop")]
    assert not of(Malformed, signals) and adapter.idle()


def test_an_api_error_fails_with_its_name_and_message_and_no_rate_limit() -> None:
    adapter, signals = run(transcript("error"))
    assert not of(RateLimited, signals)
    assert of(Result, signals) == [
        Result(ok=False, text="APIError: the stand-in refuses this request", subtype="APIError")
    ]
    assert adapter.idle()


def test_a_429_opencode_gives_up_on_is_parked_to_its_retry_after() -> None:
    # The captured error, as a 429 with retry-after (opencode itself waits out the ones it
    # deems retryable; this is the shape of one it does not).
    event = json.loads(transcript("error"))
    event["error"]["data"].update(statusCode=429, message="rate limited")
    event["error"]["data"]["responseHeaders"]["retry-after"] = "30"
    _, signals = run(json.dumps(event) + "\n")
    [limited] = of(RateLimited, signals)
    assert isinstance(limited, RateLimited)
    assert limited.resets_at == pytest.approx(event["timestamp"] / 1000 + 30)
    assert limited.source == "retry-after"


def test_unknown_events_are_logged_once_at_debug_and_never_end_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    adapter = OpencodeAdapter()
    line = '{"type":"permission","sessionID":"ses_1"}\n'
    with caplog.at_level(logging.DEBUG, logger="gridd.adapters"):
        assert adapter.feed_output(line + line) == []  # not even its session id
    assert not adapter.idle()
    assert [r.getMessage() for r in caplog.records] == [
        "opencode output: unknown message type 'permission' ignored"
    ]


def test_the_opencode_profile_is_bundled_runs_in_its_worktree_and_resumes_by_session() -> None:
    profile = builtin_profiles()["opencode"]
    assert profile.adapter == "opencode" and profile.stdin == "null"
    assert profile.command[profile.command.index("--dir") + 1] == "{worktree}"
    assert OpencodeAdapter().resume_args(["opencode", "run", "go on"], "ses_1") == [
        "opencode",
        "run",
        "--session",
        "ses_1",
        "go on",
    ]
    with pytest.raises(ConfigError):
        get_adapter("opencode", options={"model": "x"})
