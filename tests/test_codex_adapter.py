"""The Codex adapter (gridd/adapters/codex.py), pure: transcripts captured from the real CLI
(codex-cli 0.169.0, ``tests/transcripts/codex-real-*.jsonl``, stdout and stderr together as
the pool reads them) become the same signals however they are chunked; usage limits are
parked to the end of the minute codex names; tokens are priced once; the session resumes
with ``codex exec resume``."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gridd.adapters.base import (
    Cost,
    Malformed,
    ModelName,
    RateLimited,
    Result,
    SessionId,
    Signal,
    ToolUse,
    Usage,
)
from gridd.adapters.claude import ClaudeAdapter
from gridd.adapters.codex import CodexAdapter, codex_rate_limit, codex_reset_time
from gridd.adapters.prices import PRICES, price_of
from gridd.adapters.registry import get_adapter
from gridd.errors import ConfigError
from gridd.settings import builtin_profiles

TRANSCRIPTS = Path(__file__).parent / "transcripts"
ARGV = ["codex", "exec", "--json", "-s", "workspace-write", "--skip-git-repo-check"]


@pytest.fixture
def utc() -> Iterator[None]:
    """Codex says reset times in local time: the transcripts were captured with TZ=UTC."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


def transcript(name: str) -> str:
    return (TRANSCRIPTS / f"codex-real-{name}.jsonl").read_text()


def run(text: str, *, step: int | None = None, argv: list[str] | None = None) -> list[Signal]:
    adapter = CodexAdapter()
    adapter.extra_args([*(argv or [*ARGV, "-m", "gpt-5-codex"]), "the prompt"])
    pieces = [text] if step is None else [text[i : i + step] for i in range(0, len(text), step)]
    signals = [s for piece in pieces for s in adapter.feed_output(piece)]
    return signals + adapter.feed_eof()


def of(kind: type, signals: list[Signal]) -> list[Signal]:
    return [s for s in signals if isinstance(s, kind)]


@pytest.mark.parametrize("step", [None, 1, 7, 64])
def test_a_written_file_gives_the_session_the_command_the_tokens_and_one_priced_cost(
    step: int | None,
) -> None:
    signals = run(transcript("write"), step=step)
    assert of(SessionId, signals) == [SessionId("01a216ba-4f51-77c0-b645-3d5630b67b49")]
    assert of(ModelName, signals) == [ModelName("gpt-5-codex")]
    tools = of(ToolUse, signals)
    assert tools[0] == ToolUse(
        "shell", "/bin/bash -lc \"printf 'hello\\\\n' > hello.txt && echo wrote\""
    )
    assert tools[-1] == ToolUse(None)
    assert of(Usage, signals) == [Usage(2400, 160)]
    price = PRICES["gpt-5-codex"]
    [cost] = of(Cost, signals)
    assert isinstance(cost, Cost)
    assert cost.usd == pytest.approx((2400 * price.input + 160 * price.output) / 1e6)
    assert of(Result, signals) == [Result(ok=True, text="Done.", subtype="turn.completed")]
    assert not of(Malformed, signals) and not of(RateLimited, signals)


def test_the_run_is_idle_once_the_turn_completes_and_not_before() -> None:
    adapter = CodexAdapter()
    lines = transcript("write").splitlines(keepends=True)
    for line in lines[:-1]:
        adapter.feed_output(line)
        assert not adapter.idle()
    adapter.feed_output(lines[-1])
    assert adapter.idle() and adapter.ends_on_result


def test_a_usage_limit_is_said_once_and_parked_to_the_end_of_the_minute_codex_names(
    utc: None,
) -> None:
    signals = run(transcript("usage-limit"), step=5)
    [limited] = of(RateLimited, signals)
    assert isinstance(limited, RateLimited)
    assert limited.limit_type == "usage_limit" and limited.source == "message"
    # "Try again at Nov 28th, 2026 7:20 AM." codex drops the seconds: 7:21 is never early.
    assert limited.resets_at == datetime(2026, 11, 28, 7, 21, tzinfo=UTC).timestamp()
    [result] = of(Result, signals)
    assert isinstance(result, Result) and not result.ok
    assert result.text.startswith("You\u2019ve hit your usage limit.")


def test_a_429_codex_gave_up_on_is_a_rate_limit_without_a_reset_time() -> None:
    [limited] = of(RateLimited, run(transcript("429")))
    assert limited == RateLimited(
        message="exceeded retry limit, last status: 429 Too Many Requests",
        resets_at=None,
        limit_type="api_key",
        source="none",
    )


def test_an_api_error_fails_the_turn_with_its_type_and_message_and_no_rate_limit() -> None:
    signals = run(transcript("error"))
    assert not of(RateLimited, signals)
    assert of(Result, signals) == [
        Result(
            ok=False,
            text="invalid_request_error: the stand-in refuses this request",
            subtype="turn.failed",
        )
    ]


@pytest.mark.parametrize(
    ("shown", "now", "expected"),
    [
        ("7:20 AM", (2026, 11, 26, 7, 10, 0), (2026, 11, 26, 7, 21)),
        ("7:20 AM", (2026, 11, 26, 7, 20, 40), (2026, 11, 26, 7, 21)),  # this minute
        ("7:20 AM", (2026, 11, 26, 9, 0, 0), (2026, 11, 27, 7, 21)),  # past: tomorrow
        ("12:05 AM", (2026, 11, 26, 23, 0, 0), (2026, 11, 27, 0, 6)),
        ("11:59 PM", (2026, 12, 31, 22, 0, 0), (2027, 1, 1, 0, 0)),
        ("Sep 1st, 2027 10:37 PM", (2026, 11, 26, 7, 0, 0), (2027, 9, 1, 22, 38)),
    ],
)
def test_codex_reset_times_are_read_in_local_time_to_the_end_of_their_minute(
    utc: None, shown: str, now: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    at = datetime(*now, tzinfo=UTC).timestamp()
    assert codex_reset_time(shown, now=at) == datetime(*expected, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    "text",
    [
        "You've hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit "
        "https://chatgpt.com/codex/settings/usage to purchase more credits or try again at "
        "3:05 PM.",
        "ERROR: You\u2019ve hit your usage limit. To get more access now, send a request to your "
        "admin or try again at 3:05 PM.",
    ],
)
def test_every_usage_limit_phrasing_codex_prints_is_parked_with_its_reset(text: str) -> None:
    limited = codex_rate_limit(text, now=datetime(2026, 11, 26, 12, tzinfo=UTC).timestamp())
    assert limited is not None and limited.resets_at is not None


@pytest.mark.parametrize(
    "text",
    [
        "You've hit your usage limit. Try again later.",
    ],
)
def test_a_usage_limit_without_a_time_is_parked_without_a_reset(text: str) -> None:
    limited = codex_rate_limit(text)
    assert limited is not None and limited.resets_at is None


@pytest.mark.parametrize(
    "text",
    [
        "the tests hit a rate limit of 5",
        "grep 'usage limit' README.md",
        "last status: 429 in the log",
    ],
)
def test_ordinary_output_mentioning_limits_is_no_rate_limit(text: str) -> None:
    assert codex_rate_limit(text) is None


def test_unknown_events_are_logged_once_at_debug_and_never_end_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    adapter = CodexAdapter()
    line = '{"type":"thread.compacted","detail":1}\n'
    with caplog.at_level(logging.DEBUG, logger="gridd.adapters"):
        assert adapter.feed_output(line + line) == []
    assert [r.getMessage() for r in caplog.records] == [
        "codex output: unknown message type 'thread.compacted' ignored"
    ]
    assert not adapter.feed_output('{"type":"item.completed","item":{"type":"hologram"}}\n')
    assert not adapter.feed_output("Reading additional input from stdin...\n")
    assert not adapter.idle()


def test_the_model_is_read_from_the_command_or_added_from_the_adapter_option() -> None:
    assert CodexAdapter().extra_args([*ARGV, "--model", "o3", "p"]) == []
    assert CodexAdapter(model="o3").extra_args([*ARGV, "-c", 'model="gpt-5"', "p"]) == []
    assert CodexAdapter(model="o3").extra_args([*ARGV, "p"]) == ["-m", "o3"]
    unpriced = run(transcript("write"), argv=[*ARGV, "-m", "a-model-nobody-prices"])
    assert not of(Cost, unpriced) and of(Usage, unpriced)


def test_prices_match_the_longest_model_prefix() -> None:
    assert price_of("gpt-5.1-codex-mini") == PRICES["gpt-5.1-codex-mini"]
    assert price_of("openai/gpt-5-codex") == PRICES["gpt-5-codex"]
    assert price_of("gpt-5-2026-08-07") == PRICES["gpt-5"]
    assert price_of("llama-3") is None and price_of(None) is None


def test_a_resumed_run_goes_through_codex_exec_resume_and_claude_through_its_flag() -> None:
    argv = [*ARGV, "-m", "gpt-5-codex", "go on"]
    assert CodexAdapter().resume_args(argv, "t-1") == [
        *ARGV,
        "-m",
        "gpt-5-codex",
        "resume",
        "t-1",
        "go on",
    ]
    assert ClaudeAdapter().resume_args(["claude", "-p"], "s-1") == [
        "claude",
        "-p",
        "--resume",
        "s-1",
    ]


def test_the_codex_profile_is_bundled_and_its_options_are_checked() -> None:
    profile = builtin_profiles()["codex"]
    assert profile.adapter == "codex" and profile.stdin == "null"
    assert profile.command[:3] == ["codex", "exec", "--json"] and profile.command[-1] == "{prompt}"
    assert isinstance(get_adapter("codex", options={"model": "gpt-5"}), CodexAdapter)
    with pytest.raises(ConfigError):
        get_adapter("codex", options={"model": 5})
    with pytest.raises(ConfigError):
        get_adapter("codex", options={"sandbox": "none"})


def test_a_run_adopted_after_a_restart_still_prices_its_tokens_from_its_command() -> None:
    adapter = CodexAdapter()
    adapter.adopt([*ARGV, "-m", "gpt-5-codex", "the prompt"])  # never saw extra_args
    signals = adapter.feed_output(transcript("write"))
    assert of(ModelName, signals) == [ModelName("gpt-5-codex")]
    assert len(of(Cost, signals)) == 1
