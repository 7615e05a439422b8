"""The Gemini CLI adapter (gridd/adapters/gemini.py), pure: transcripts captured from the
real CLI (gemini-cli 0.61.0, ``tests/transcripts/gemini-real-*.jsonl``, stdout and stderr
together as the pool reads them) become the same signals however they are chunked."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gridd.adapters.base import (
    Cost,
    Malformed,
    ModelName,
    RateLimited,
    Result,
    Retrying,
    SessionId,
    Signal,
    ToolUse,
    Usage,
)
from gridd.adapters.gemini import GeminiAdapter
from gridd.adapters.prices import PRICES
from gridd.adapters.registry import get_adapter
from gridd.errors import ConfigError
from gridd.settings import builtin_profiles

TRANSCRIPTS = Path(__file__).parent / "transcripts"


def run(name: str, *, step: int | None = None) -> tuple[GeminiAdapter, list[Signal]]:
    text = (TRANSCRIPTS / f"gemini-real-{name}.jsonl").read_text()
    adapter = GeminiAdapter()
    pieces = [text] if step is None else [text[i : i + step] for i in range(0, len(text), step)]
    signals = [s for piece in pieces for s in adapter.feed_output(piece)]
    return adapter, signals + adapter.feed_eof()


def of(kind: type, signals: list[Signal]) -> list[Signal]:
    return [s for s in signals if isinstance(s, kind)]


@pytest.mark.parametrize("step", [None, 1, 13])
def test_a_written_file_gives_the_model_the_tool_the_tokens_and_one_priced_cost(
    step: int | None,
) -> None:
    adapter, signals = run("write", step=step)
    assert of(ModelName, signals) == [ModelName("gemini-2.5-pro")]
    assert of(SessionId, signals) == [SessionId("f1379ed2-4d57-4ebc-b8da-c83bb4b8068b")]
    assert of(ToolUse, signals) == [ToolUse("write_file", "/work/repo/hello.txt"), ToolUse(None)]
    assert of(Usage, signals) == [Usage(2000, 100)]
    price = PRICES["gemini-2.5-pro"]
    [cost] = of(Cost, signals)
    assert isinstance(cost, Cost)
    assert cost.usd == pytest.approx((2000 * price.input + 100 * price.output) / 1e6)
    assert of(Result, signals) == [Result(ok=True, text="Wrote hello.txt.", subtype="success")]
    assert not of(Malformed, signals) and not of(RateLimited, signals)
    assert adapter.idle() and adapter.ends_on_result


def test_a_quota_error_with_a_retry_delay_is_parked_to_the_results_time_plus_it() -> None:
    adapter, signals = run("quota-retry-after", step=17)
    [limited] = of(RateLimited, signals)
    said = datetime(2026, 11, 26, 7, 36, 40, 278000, tzinfo=UTC).timestamp()
    assert limited == RateLimited(
        message="You exceeded your current quota.",
        resets_at=pytest.approx(said + 400),  # type: ignore[arg-type]
        limit_type="quota",
        source="retry-after",
    )
    # The model answered before the quota: its session exists and can be resumed.
    assert of(SessionId, signals) == [SessionId("03fdedaa-8746-4c58-b478-ddf88d78e987")]
    [result] = of(Result, signals)
    assert isinstance(result, Result) and not result.ok
    assert adapter.idle()  # the result ends the run, failed or not


def test_a_daily_quota_names_no_reset_and_a_run_the_model_never_answered_has_no_session() -> None:
    _, signals = run("quota-daily")
    [limited] = of(RateLimited, signals)
    assert isinstance(limited, RateLimited)
    assert limited.resets_at is None and limited.limit_type == "daily"
    assert limited.message == "You have exhausted your daily quota on this model."
    assert not of(SessionId, signals)  # resuming it by id would fail


def test_an_api_error_fails_with_its_status_and_message_and_no_rate_limit() -> None:
    _, signals = run("error")
    assert not of(RateLimited, signals)
    assert of(Result, signals) == [
        Result(
            ok=False,
            text="INVALID_ARGUMENT: the stand-in refuses this request",
            subtype="error",
        )
    ]


def test_a_retry_the_cli_makes_itself_is_shown_as_retrying() -> None:
    _, signals = run("retrying", step=5)
    assert of(Retrying, signals) == [
        Retrying(
            attempt=1,
            max_retries=None,
            delay=5.175,
            error="You exceeded your current quota.",
            status=429,
        )
    ]
    assert of(Result, signals) == [Result(ok=True, text="Done.", subtype="success")]


def test_unknown_events_are_logged_once_at_debug_and_never_end_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    adapter = GeminiAdapter()
    line = '{"type":"thought","content":"hm"}\n'
    with caplog.at_level(logging.DEBUG, logger="gridd.adapters"):
        assert adapter.feed_output(line + line) == []
    assert [r.getMessage() for r in caplog.records] == [
        "gemini output: unknown message type 'thought' ignored"
    ]
    assert not adapter.idle()


def test_the_gemini_profile_is_bundled_and_resumes_by_session_id() -> None:
    profile = builtin_profiles()["gemini"]
    assert profile.adapter == "gemini" and profile.stdin == "null"
    assert "--approval-mode" in profile.command and profile.command[-2:] == ["-p", "{prompt}"]
    assert GeminiAdapter().resume_args(["gemini", "-p", "x"], "s-1") == [
        "gemini",
        "-p",
        "x",
        "--resume",
        "s-1",
    ]
    with pytest.raises(ConfigError):
        get_adapter("gemini", options={"model": "x"})
