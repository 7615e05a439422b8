"""The adapters (gridd/adapters): pure parsers tested against recorded-shape transcripts in
every chunking, and the claude adapter driven end to end against the fake ``claude``."""

from __future__ import annotations

import codecs
import json
import logging
import os
import random
import selectors
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gridd.adapters.base import (
    Activity,
    Adapter,
    Ask,
    Continue,
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
from gridd.adapters.beat import Beat, parse_beat
from gridd.adapters.claude import ClaudeAdapter
from gridd.adapters.heartbeat import HeartbeatAdapter
from gridd.adapters.lines import LineSplitter, Overlong
from gridd.adapters.patterns import PatternsAdapter
from gridd.adapters.ratelimit import detect_rate_limit, parse_reset_time, parse_timestamp
from gridd.adapters.registry import ADAPTER_NAMES, get_adapter
from gridd.errors import ConfigError, ValidationFailed

HERE = Path(__file__).parent
TRANSCRIPTS = HERE / "transcripts"
FAKE_CLAUDE = HERE / "fakes" / "claude"
WAIT = "<<wait>>"
SID = "8f1d3c2e-5b7a-4e0f-9c61-2d4b8a7e0f13"


def transcript(name: str) -> str:
    return (TRANSCRIPTS / name).read_text()


#: Signals that only describe the run (shown on the agent); most tests leave them out.
DESCRIPTIVE = (ModelName, ToolUse, Usage)


def feed(adapter: Adapter, chunks: list[str], *, every: bool = False) -> list[Signal]:
    signals: list[Signal] = []
    for chunk in chunks:
        signals.extend(adapter.feed_output(chunk))
    return signals if every else [s for s in signals if not isinstance(s, DESCRIPTIVE)]


def every_split(text: str) -> Iterator[list[str]]:
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]


def random_chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 40))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def beat(obj: dict[str, Any]) -> Beat:
    parsed = parse_beat(json.dumps(obj))
    assert isinstance(parsed, Beat), parsed
    return parsed


def asks(signals: list[Signal]) -> list[Ask]:
    return [s for s in signals if isinstance(s, Ask)]


# --- lines -------------------------------------------------------------------------------


def test_line_splitter_gives_the_same_lines_however_the_text_is_cut() -> None:
    text = "alpha\r\nbeta\n\ngamma é\ndelta"
    for chunks in every_split(text):
        splitter = LineSplitter()
        lines = [line for chunk in chunks for line in splitter.feed(chunk)]
        assert lines == ["alpha", "beta", "", "gamma é"]
        assert splitter.partial == "delta"
        assert splitter.flush() == ["delta"]


def test_line_splitter_drops_an_overlong_line_and_recovers() -> None:
    splitter = LineSplitter(max_line=10)
    out = splitter.feed("short\n" + "x" * 7)
    out += splitter.feed("y" * 30)
    assert splitter.partial == ""
    out += splitter.feed("z\nafter\n")
    assert out == ["short", Overlong(38), "after"]


# --- rate limits -------------------------------------------------------------------------

NOON_UTC = 1_767_268_800.0  # 2026-01-01 12:00:00 UTC


@pytest.mark.parametrize(
    ("line", "resets_at"),
    [
        ("Claude AI usage limit reached|1755615600", 1755615600.0),
        ("You've hit your limit · resets 1pm (Europe/Lisbon)", NOON_UTC + 3600),
        ("You've hit your session limit · resets 12:50am (UTC)", NOON_UTC + 12 * 3600 + 3000),
        ("5-hour limit reached ∙ resets 3pm (UTC)", NOON_UTC + 3 * 3600),
        (
            "Claude usage limit reached. Your limit will reset at 11am (Asia/Tokyo).",
            NOON_UTC + 14 * 3600,  # 21:00 in Tokyo now: 11am is tomorrow
        ),
        ("You've hit your limit - resets Jan 3, 11am (UTC)", NOON_UTC + 47 * 3600),
        ("You've hit your limit · resets 1pm (Not/AZone)", None),
    ],
)
def test_known_usage_limit_notices_are_recognised(line: str, resets_at: float | None) -> None:
    assert detect_rate_limit(line, now=NOON_UTC) == RateLimited(line, resets_at)


@pytest.mark.parametrize(
    "line",
    [
        "Error: Claude AI usage limit reached|1755615600",
        "Claude AI usage limit reached|soon",
        "I think the usage limit reached its cap",
        "5-hour limit reached",
        "You've hit your limit",
        "rate limited, retrying",
    ],
)
def test_near_miss_limit_text_is_ordinary_output(line: str) -> None:
    assert detect_rate_limit(line, now=NOON_UTC) is None


def test_reset_times_and_timestamps_parse() -> None:
    assert parse_reset_time("11am (UTC)", now=NOON_UTC) == NOON_UTC + 23 * 3600
    assert parse_reset_time("13pm (UTC)", now=NOON_UTC) is None
    assert parse_timestamp(1767268800) == NOON_UTC
    assert parse_timestamp(1767268800000) == NOON_UTC
    assert parse_timestamp("2026-01-01T12:00:00Z") == NOON_UTC
    assert parse_timestamp("2026-01-01T13:00:00+01:00") == NOON_UTC
    assert parse_timestamp("soon") is None
    assert parse_timestamp(True) is None


# --- heartbeat ---------------------------------------------------------------------------


def test_heartbeat_adapter_treats_plain_output_as_life_only() -> None:
    adapter = HeartbeatAdapter()
    text = "Working...\nShould I delete the database?\nContinue? [y/N] "
    for chunks in every_split(text):
        assert feed(adapter, chunks) == []
    assert adapter.initial_input("do it") is None
    assert adapter.feed_eof() == []


def test_heartbeat_adapter_spots_an_exact_limit_notice_in_output_in_any_chunking() -> None:
    text = "step 1\nClaude AI usage limit reached|1755615600\n"
    for chunks in every_split(text):
        assert feed(HeartbeatAdapter(), chunks) == [
            RateLimited("Claude AI usage limit reached|1755615600", 1755615600.0)
        ]


def test_heartbeat_beats_become_signals() -> None:
    adapter = HeartbeatAdapter()
    assert adapter.feed_heartbeat(beat({"status": "started"})) == [Activity("started")]
    assert adapter.feed_heartbeat(
        beat({"status": "working", "label": "tests", "message": "3/9", "cost_usd": 0.5})
    ) == [Activity("tests", "3/9"), Cost(0.5)]
    assert adapter.feed_heartbeat(beat({"status": "continue", "message": "half done"})) == [
        Activity("continue", "half done"),
        Continue("half done"),
    ]
    limited = adapter.feed_heartbeat(
        beat({"status": "rate_limited", "message": "quota", "resets_at": "2026-01-01T12:00:00Z"})
    )
    assert limited == [
        Activity("rate_limited", "quota"),
        RateLimited("quota", NOON_UTC, source="heartbeat"),
    ]
    assert adapter.feed_heartbeat(beat({"status": "rate_limited", "resets_at": 1755615600}))[
        1
    ] == RateLimited("usage limit reached", 1755615600.0, source="heartbeat")


def test_heartbeat_question_becomes_an_ask_once_and_its_answer_one_line() -> None:
    adapter = HeartbeatAdapter()
    question = {
        "status": "question",
        "question": "Which DB?",
        "options": ["sqlite", "postgres", 3, None, "sqlite"],
        "type": "decision",
        "id": "db",
    }
    signals = adapter.feed_heartbeat(beat(question))
    ask = Ask("db", "decision", "Which DB?", ["sqlite", "postgres", "3"])
    assert signals == [Activity("question"), ask]
    assert asks(adapter.feed_heartbeat(beat(question))) == []  # beaten again while waiting
    assert adapter.encode_answer(ask, "postgres,\nplease\r\nnow") == "postgres, please now\n"
    assert asks(adapter.feed_heartbeat(beat(question))) == []  # a stale repeat after it

    plain = {"status": "question", "message": "Ready to merge?", "type": "nonsense"}
    first = asks(adapter.feed_heartbeat(beat(plain)))
    assert first == [Ask("q1", "clarification", "Ready to merge?", [])]
    assert asks(adapter.feed_heartbeat(beat(plain))) == []
    adapter.encode_answer(first[0], "yes")
    assert [a.key for a in asks(adapter.feed_heartbeat(beat(plain)))] == ["q2"]


def test_heartbeat_question_without_text_is_malformed_not_fatal() -> None:
    signals = HeartbeatAdapter().feed_heartbeat(beat({"status": "question", "options": ["a"]}))
    assert signals[0] == Activity("question")
    assert isinstance(signals[1], Malformed)


# --- claude ------------------------------------------------------------------------------

WRITE_INPUT = {
    "file_path": "/work/repo/.grid/worktrees/t-42/CHANGELOG.md",
    "content": "## 0.2.0\n- Fix greeting\n",
}
QUESTION = "Which greeting style should the CLI use?"
QUESTIONS = {
    "questions": [
        {
            "question": QUESTION,
            "header": "Greeting",
            "options": [
                {"label": "Formal", "description": "Good morning, user."},
                {"label": "Casual", "description": "Hey there!"},
            ],
            "multiSelect": False,
        }
    ]
}


def test_claude_initial_input_is_the_first_stream_json_user_message() -> None:
    line = ClaudeAdapter().initial_input('fix "it"\nnow')
    assert line == ('{"type":"user","message":{"role":"user","content":"fix \\"it\\"\\nnow"}}\n')


ACCEPT_EDITS = "allow, and switch to acceptEdits mode for this session"
ACCEPT_EDITS_SUGGESTION = {"type": "setMode", "mode": "acceptEdits", "destination": "session"}


def test_claude_permission_suggestion_chosen_goes_back_as_updated_permissions() -> None:
    adapter = ClaudeAdapter()
    (ask,) = asks(feed(adapter, [transcript("claude-permission.jsonl")]))
    assert ACCEPT_EDITS in ask.options
    sent = json.loads(adapter.encode_answer(ask, ACCEPT_EDITS))
    decision = sent["response"]["response"]
    assert decision == {
        "behavior": "allow",
        "updatedInput": WRITE_INPUT,
        "updatedPermissions": [ACCEPT_EDITS_SUGGESTION],
    }


def test_claude_permission_transcript_becomes_activity_ask_cost_result() -> None:
    adapter = ClaudeAdapter()
    signals = feed(adapter, [transcript("claude-permission.jsonl")])
    ask = Ask(
        "req_7c2f9a",
        "permission",
        "Allow Write: /work/repo/.grid/worktrees/t-42/CHANGELOG.md?",
        ["allow", "deny", ACCEPT_EDITS],
        {
            "route": "control",
            "request_id": "req_7c2f9a",
            "tool_name": "Write",
            "input": WRITE_INPUT,
            "tool_use_id": "toolu_02Wr",
            "suggestions": {ACCEPT_EDITS: ACCEPT_EDITS_SUGGESTION},
        },
    )
    assert signals == [
        SessionId(SID),
        Activity("starting", "claude-sonnet-4-5-20250929"),
        Activity("text", "I'll read the current greeting first, then add a changelog entry."),
        Activity("Read", "/work/repo/.grid/worktrees/t-42/hello.py"),
        Activity("Write", "/work/repo/.grid/worktrees/t-42/CHANGELOG.md"),
        ask,
        Activity("text", "Added the changelog entry."),
        Cost(0.04871),
        Result(True, "Added the changelog entry.", "success", 4),
    ]
    allow = {"behavior": "allow", "updatedInput": WRITE_INPUT}
    envelope = {"subtype": "success", "request_id": "req_7c2f9a", "response": allow}
    expected = json.dumps({"type": "control_response", "response": envelope})
    assert json.loads(adapter.encode_answer(ask, " Allow ")) == json.loads(expected)
    deny = adapter.encode_answer(ask, "deny")
    assert deny.endswith("\n") and deny.count("\n") == 1
    assert json.loads(deny)["response"]["response"] == {
        "behavior": "deny",
        "message": "denied by user",
    }
    with pytest.raises(ValidationFailed):
        adapter.encode_answer(ask, "perhaps")


@pytest.mark.parametrize(
    "name",
    [
        "claude-permission.jsonl",
        "claude-real-rate-limit-five-hour.jsonl",
        "claude-real-api-retry-429.jsonl",
        "claude-real-write-permission.jsonl",
        "claude-ask-control.jsonl",
        "claude-ask-dismissed.jsonl",
        "claude-rate-limit.jsonl",
        "claude-malformed.jsonl",
    ],
)
def test_claude_transcripts_parse_the_same_in_any_chunking(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gridd.adapters import claude_limits

    # An API key's 429 parks until "now + retry-after": the same now for every parse.
    monkeypatch.setattr(claude_limits.time, "time", lambda: CAPTURED_AT)
    text = transcript(name)
    whole = feed(ClaudeAdapter(), [text])
    assert any(isinstance(s, Result) for s in whole)
    assert feed(ClaudeAdapter(), list(text)) == whole
    rng = random.Random(name)
    for _ in range(60):
        assert feed(ClaudeAdapter(), random_chunks(text, rng)) == whole


def test_claude_small_stream_parses_the_same_at_every_split_point() -> None:
    text = (
        '{"type":"system","subtype":"init","session_id":"s1"}\n'
        "not json\n"
        '{"type":"result","subtype":"success","is_error":false,"result":"ok",'
        '"num_turns":1,"cost_usd":0.5}\n'
    )
    expected = feed(ClaudeAdapter(), [text])
    assert [type(s) for s in expected] == [SessionId, Activity, Malformed, Cost, Result]
    assert Cost(0.5) in expected  # the older cost field
    for chunks in every_split(text):
        assert feed(ClaudeAdapter(), chunks) == expected


def test_claude_truncated_json_waits_for_its_newline() -> None:
    adapter = ClaudeAdapter()
    line = '{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":9}'
    assert adapter.feed_output(line[:30]) == []
    assert adapter.feed_output(line[30:]) == []
    assert adapter.feed_output("\n") == [Result(False, "", "error_max_turns", 9)]
    assert adapter.feed_output('{"type":"res') == []
    assert [type(s) for s in adapter.feed_eof()] == [Malformed]


def test_claude_garbage_is_skipped_with_few_warnings_and_never_raises() -> None:
    adapter = ClaudeAdapter()
    noise = "".join(f"garbage line {i}\n" for i in range(250))
    warnings = feed(adapter, [noise])
    assert len(warnings) == 3 and all(isinstance(w, Malformed) for w in warnings)
    rng = random.Random(7)
    alphabet = '{}[]":,\\ntrueflsnul0123456789 \x00é\n'
    for _ in range(300):
        junk = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        adapter.feed_output(junk)
    for odd in (
        '{"type":"assistant","message":null}',
        '{"type":"assistant","message":{"content":7}}',
        '{"type":"control_request","request_id":5}',
        '{"type":"result","num_turns":true}',
        '{"type":"user","message":{"content":[1,{"type":"tool_result"}]}}',
    ):
        adapter.feed_output(odd + "\n")
    huge = adapter.feed_output('{"type":"user","x":"' + "y" * (17 * 1024 * 1024) + '"}\n')
    assert huge == [] or all(isinstance(s, Malformed) for s in huge)


def test_claude_malformed_transcript_warns_once_and_completes() -> None:
    signals = feed(ClaudeAdapter(), [transcript("claude-malformed.jsonl")])
    assert len([s for s in signals if isinstance(s, Malformed)]) == 1
    assert Activity("Bash", "python -m pytest -q") in signals
    assert signals[-1] == Result(True, "All tests pass.", "success", 2)


def test_claude_skips_a_newer_cli_message_type_logging_it_once_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """2.1.332's write, captured, with a message type gridd does not know put mid-stream:
    nothing it carries is read (not its session id), and the run's cost is the result's."""
    lines = transcript("claude-real-write-allowed.jsonl").splitlines(keepends=True)
    future = '{"type":"subagent_turn","session_id":"a-subagents-session","total_cost_usd":9}\n'
    adapter = ClaudeAdapter()
    with caplog.at_level(logging.DEBUG, logger="gridd.adapters"):
        signals = feed(adapter, [*lines[:3], future, future, *lines[3:]])
    assert [r.getMessage() for r in caplog.records] == [
        "claude output: unknown message type 'subagent_turn' ignored"
    ]
    assert [s for s in signals if isinstance(s, SessionId)] == [
        SessionId("184aa724-1381-478b-af17-3781b4afef7c")
    ]
    assert [s for s in signals if isinstance(s, Cost)] == [Cost(0.00068)]
    assert not [s for s in signals if isinstance(s, Malformed)]
    assert signals[-1] == Result(True, "Done.", "success", 2) and adapter.idle()


def test_claude_ask_user_question_is_one_ask_answered_through_the_control_protocol() -> None:
    adapter = ClaudeAdapter()
    signals = feed(adapter, transcript("claude-ask-control.jsonl").splitlines(keepends=True))
    (ask,) = asks(signals)
    assert (ask.key, ask.type, ask.question, ask.options) == (
        "toolu_01Ak",
        "decision",
        QUESTION,
        ["Formal", "Casual"],
    )
    assert ask.meta["free_text"] is True
    answer = json.loads(adapter.encode_answer(ask, "Casual"))
    assert answer == {
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": "req_1a2b3c",
            "response": {
                "behavior": "allow",
                "updatedInput": {**QUESTIONS, "answers": {QUESTION: "Casual"}},
            },
        },
    }


def test_claude_with_stdio_permission_tool_asks_when_the_control_request_comes() -> None:
    adapter = ClaudeAdapter(permission_prompt_tool="stdio")
    lines = transcript("claude-ask-control.jsonl").splitlines(keepends=True)
    assert asks(feed(adapter, lines[:3])) == []
    (ask,) = asks(adapter.feed_output(lines[3]))
    assert ask.key == "toolu_01Ak" and ask.meta["request_id"] == "req_1a2b3c"


def test_claude_ask_user_question_without_control_is_answered_with_a_tool_result() -> None:
    adapter = ClaudeAdapter()
    lines = transcript("claude-ask-control.jsonl").splitlines(keepends=True)
    (ask,) = asks(feed(adapter, lines[:3]))
    assert adapter.encode_answer(ask, "Formal") == (
        '{"type":"user","message":{"role":"user","content":[{"type":"tool_result",'
        '"tool_use_id":"toolu_01Ak","content":"Formal"}]}}\n'
    )


def test_claude_question_it_dismissed_is_answered_as_a_new_message() -> None:
    adapter = ClaudeAdapter()
    signals = feed(adapter, [transcript("claude-ask-dismissed.jsonl")])
    (ask,) = asks(signals)
    assert Activity("question dismissed by claude", "toolu_09Dz") in signals
    message = json.loads(adapter.encode_answer(ask, "Casual"))
    assert message == {
        "type": "user",
        "message": {"role": "user", "content": f'Answer to "{QUESTION}": Casual'},
    }


def test_claude_several_questions_take_a_json_object_of_answers() -> None:
    adapter = ClaudeAdapter()
    two = {"questions": [{"question": "A?", "options": []}, {"question": "B?", "header": "Bee"}]}
    line = {
        "type": "control_request",
        "request_id": "r9",
        "request": {"subtype": "can_use_tool", "tool_name": "AskUserQuestion", "input": two},
    }
    (ask,) = asks(adapter.feed_output(json.dumps(line) + "\n"))
    assert (ask.type, ask.question, ask.options) == ("clarification", "1: A?\nBee: B?", [])
    sent = json.loads(adapter.encode_answer(ask, '{"A?": "x", "B?": "y"}'))
    assert sent["response"]["response"]["updatedInput"]["answers"] == {"A?": "x", "B?": "y"}


def test_claude_rate_limit_notice_and_error_result() -> None:
    signals = feed(ClaudeAdapter(), [transcript("claude-rate-limit.jsonl")])
    limited = RateLimited("Claude AI usage limit reached|1755615600", 1755615600.0)
    # Reported once, by the result (the assistant text repeating it is only shown).
    assert signals[2:] == [
        Activity("text", "Claude AI usage limit reached|1755615600"),
        Cost(0.0),
        limited,
        Result(False, "Claude AI usage limit reached|1755615600", "success", 1),
    ]


def test_claude_control_requests_it_cannot_answer_or_that_are_withdrawn() -> None:
    adapter = ClaudeAdapter()
    hook = {
        "type": "control_request",
        "request_id": "h1",
        "request": {"subtype": "hook_callback", "callback_id": "c"},
    }
    assert [type(s) for s in adapter.feed_output(json.dumps(hook) + "\n")] == [Malformed]
    perm = {
        "type": "control_request",
        "request_id": "p1",
        "request": {
            "subtype": "can_use_tool",
            "tool_name": "Bash",
            "input": {"command": "rm -rf build"},
        },
    }
    (ask,) = asks(adapter.feed_output(json.dumps(perm) + "\n"))
    assert ask.question == "Allow Bash: rm -rf build?"
    cancel = {"type": "control_cancel_request", "request_id": "p1"}
    assert adapter.feed_output(json.dumps(cancel) + "\n") == [
        Activity("question withdrawn by claude", "p1")
    ]


def test_claude_session_id_is_reported_again_only_when_it_changes() -> None:
    adapter = ClaudeAdapter()
    lines = [
        {"type": "system", "subtype": "init", "session_id": "a"},
        {"type": "assistant", "session_id": "a", "message": {"content": "hi"}},
        {"type": "result", "subtype": "success", "session_id": "b", "result": ""},
    ]
    signals = feed(adapter, [json.dumps(line) + "\n" for line in lines])
    assert [s for s in signals if isinstance(s, SessionId)] == [SessionId("a"), SessionId("b")]


# --- patterns ----------------------------------------------------------------------------


def golden(name: str) -> tuple[list[str], list[dict[str, Any]]]:
    segments = transcript(f"{name}.txt").split(WAIT)
    expected = json.loads(transcript(f"{name}.expected.json"))["asks"]
    return segments, expected


def summary(signals: list[Signal]) -> list[dict[str, Any]]:
    return [
        {"pattern": a.meta["pattern"], "type": a.type, "question": a.question, "options": a.options}
        for a in asks(signals)
    ]


@pytest.mark.parametrize("name", ["aider-add-files", "aider-shell"])
def test_aider_transcripts_produce_exactly_the_golden_questions(name: str) -> None:
    segments, expected = golden(name)
    assert summary(feed(PatternsAdapter(pack="aider"), segments)) == expected
    assert summary(feed(PatternsAdapter(pack="aider"), [c for s in segments for c in s])) == (
        expected
    )
    for index, segment in enumerate(segments):  # every split point of every segment
        for chunks in every_split(segment):
            pieces = [*segments[:index], *chunks, *segments[index + 1 :]]
            assert summary(feed(PatternsAdapter(pack="aider"), pieces)) == expected
    rng = random.Random(name)
    for _ in range(30):
        pieces = [c for s in segments for c in (random_chunks(s, rng) if len(s) > 1 else [s])]
        assert summary(feed(PatternsAdapter(pack="aider"), pieces)) == expected


def test_a_prompt_already_followed_by_more_output_is_not_a_question() -> None:
    text = transcript("aider-shell.txt").replace(WAIT, "")
    assert asks(feed(PatternsAdapter(pack="aider"), [text])) == []


@pytest.mark.parametrize(
    "waiting",
    [
        "Should I also update the tests?",
        "Continue? [y/N] ",
        "Overwrite file? (y/n): ",
        "Proceed (Y)es/(N)o: ",
        "> Run shell command? (Y)es/(N)o [Yes]: ",
        "add file to the chat? (Y)es/(N)o [Yes]: ",
        "Add file to the chat? (Y)es/(N)o [Maybe]: ",
        "Add file to the chat? (Y)es/(N)o/(Q)uit [Yes]: ",
    ],
)
def test_unknown_text_never_becomes_a_question(waiting: str) -> None:
    for chunks in every_split("some output\n" + waiting):
        assert asks(feed(PatternsAdapter(pack="aider"), chunks)) == []


def test_a_waiting_line_is_asked_about_once() -> None:
    adapter = PatternsAdapter(pack="aider")
    assert len(asks(adapter.feed_output("x.py\nCreate new file? (Y)es/(N)o [Yes]:"))) == 1
    assert asks(adapter.feed_output(" ")) == []
    assert asks(adapter.feed_output("\x1b[0m")) == []
    assert asks(adapter.feed_output("\ny.py\nCreate new file? (Y)es/(N)o [Yes]: ")) != []


def test_pattern_answers_are_the_cli_keystrokes_and_only_offered_options() -> None:
    adapter = PatternsAdapter(pack="aider")
    segments, _ = golden("aider-add-files")
    first = asks(feed(adapter, segments[:1]))[0]
    assert adapter.encode_answer(first, "yes") == "y\n"
    assert adapter.encode_answer(first, " No ") == "n\n"
    assert adapter.encode_answer(first, "skip all") == "s\n"
    assert adapter.encode_answer(first, "a") == "a\n"
    assert adapter.encode_answer(first, "don't ask again") == "d\n"
    narrow = asks(adapter.feed_output("\nCreate new file? (Y)es/(N)o [Yes]: "))[0]
    for bad in ("all", "maybe", ""):
        with pytest.raises(ValidationFailed):
            adapter.encode_answer(narrow, bad)


def test_nothing_is_answered_automatically_unless_the_profile_names_the_pattern() -> None:
    segments, _ = golden("aider-shell")
    plain = PatternsAdapter(pack="aider")
    assert all(plain.auto_answer(a) is None for a in asks(feed(plain, segments)))
    auto = PatternsAdapter(
        pack="aider", auto_answer={"aider.gitignore": "y", "aider.run_shell": "all"}
    )
    answers = {a.meta["pattern"]: auto.auto_answer(a) for a in asks(feed(auto, segments))}
    assert answers["aider.gitignore"] == "yes"
    assert answers["aider.run_shell"] is None  # this prompt offers no (A)ll
    assert {k: v for k, v in answers.items() if v is not None} == {"aider.gitignore": "yes"}


def test_bad_pattern_options_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        PatternsAdapter(pack="nope")
    with pytest.raises(ConfigError):
        PatternsAdapter(pack="aider", auto_answer={"aider.nope": "y"})
    with pytest.raises(ConfigError):
        PatternsAdapter(pack="aider", auto_answer={"aider.add_file": "maybe"})


def test_patterns_adapter_reads_heartbeats_too() -> None:
    adapter = PatternsAdapter(pack="aider", send_prompt=True)
    assert adapter.initial_input("fix\nit") == "fix it\n"
    (ask,) = asks(adapter.feed_heartbeat(beat({"status": "question", "question": "Go?"})))
    assert adapter.encode_answer(ask, "go") == "go\n"


# --- registry ----------------------------------------------------------------------------


def test_registry_builds_a_fresh_adapter_per_name() -> None:
    assert set(ADAPTER_NAMES) == {
        "heartbeat",
        "plain",
        "claude",
        "codex",
        "gemini",
        "opencode",
        "patterns",
    }
    assert isinstance(get_adapter("plain"), HeartbeatAdapter)
    assert get_adapter("heartbeat") is not get_adapter("heartbeat")
    assert isinstance(get_adapter("claude"), ClaudeAdapter)
    stdio = get_adapter("claude", options={"permission_prompt_tool": "stdio"})
    assert isinstance(stdio, ClaudeAdapter)
    patterns = get_adapter("patterns", options={"pack": "aider", "auto_answer": {}})
    assert isinstance(patterns, PatternsAdapter)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("cursor", None),
        ("", None),
        ("claude", {"model": "x"}),
        ("claude", {"permission_prompt_tool": "mcp"}),
        ("heartbeat", {"pack": "aider"}),
        ("patterns", None),
        ("patterns", {"pack": "aider", "auto_answer": ["y"]}),
        ("patterns", {"pack": "aider", "send_prompt": "yes"}),
    ],
)
def test_registry_rejects_unknown_names_and_options(
    name: str, options: dict[str, Any] | None
) -> None:
    with pytest.raises(ConfigError):
        get_adapter(name, options=options)


# --- the fake claude, end to end ---------------------------------------------------------

Respond = Callable[[Ask], str]


def run_fake_claude(
    cwd: Path,
    prompt: str,
    respond: Respond | None = None,
    *,
    args: tuple[str, ...] = (),
    adapter: ClaudeAdapter | None = None,
) -> tuple[list[Signal], int]:
    """Run tests/fakes/claude with pipes; answer each Ask on its stdin as the pool will."""
    adapter = adapter or ClaudeAdapter()
    argv = [str(FAKE_CLAUDE), "-p", "--output-format", "stream-json"]
    argv += ["--input-format", "stream-json", "--verbose", *args]
    env = {**os.environ, "FAKE_CLAUDE_LOG": str(cwd / "stdin.log")}
    env.pop("FAKE_CLAUDE_SCENARIO", None)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    first = adapter.initial_input(prompt)
    assert first is not None
    proc.stdin.write(first.encode())
    proc.stdin.flush()
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    signals: list[Signal] = []
    deadline = time.monotonic() + 10
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout.fileno(), selectors.EVENT_READ)
            while True:
                if not selector.select(max(0.0, deadline - time.monotonic())):
                    pytest.fail(f"fake claude went quiet; signals so far: {signals}")
                data = os.read(proc.stdout.fileno(), 4096)
                new = adapter.feed_output(decoder.decode(data)) if data else adapter.feed_eof()
                signals.extend(new)
                for ask in asks(new):
                    assert respond is not None, f"unexpected question {ask}"
                    proc.stdin.write(adapter.encode_answer(ask, respond(ask)).encode())
                    proc.stdin.flush()
                if adapter.idle() and not proc.stdin.closed:
                    proc.stdin.close()  # as the pool does: the conversation is over
                if not data:
                    break
        if not proc.stdin.closed:
            proc.stdin.close()
        return signals, proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def assert_completed(signals: list[Signal]) -> None:
    sessions = [s for s in signals if isinstance(s, SessionId)]
    assert len(sessions) == 1 and sessions[0].value
    assert Cost(0.0123) in signals
    assert isinstance(signals[-1], Result) and signals[-1].ok
    assert not [s for s in signals if isinstance(s, Malformed)]


@pytest.mark.parametrize("decision", ["allow", "deny"])
def test_fake_claude_permission_round_trip(tmp_path: Path, decision: str) -> None:
    seen: list[Ask] = []

    def respond(ask: Ask) -> str:
        seen.append(ask)
        return decision

    signals, code = run_fake_claude(tmp_path, "please scenario:permission", respond)
    assert code == 0
    assert_completed(signals)
    (ask,) = seen
    assert ask.type == "permission" and ask.options == ["allow", "deny"]
    assert ask.question == f"Allow Write: {tmp_path / 'permitted.txt'}?"
    written = tmp_path / "permitted.txt"
    assert written.exists() == (decision == "allow")
    sent = (tmp_path / "stdin.log").read_text().splitlines()
    assert json.loads(sent[1])["response"]["request_id"] == ask.meta["request_id"]


def test_fake_claude_ask_round_trip_with_a_tool_result(tmp_path: Path) -> None:
    signals, code = run_fake_claude(tmp_path, "scenario:ask pick one", lambda ask: "blue")
    assert code == 0
    assert_completed(signals)
    (ask,) = asks(signals)
    assert (ask.type, ask.options) == ("decision", ["red", "blue"])
    assert (tmp_path / "answer.txt").read_text() == "blue\n"


def test_fake_claude_ask_round_trip_through_the_control_protocol(tmp_path: Path) -> None:
    signals, code = run_fake_claude(
        tmp_path,
        "scenario:ask",
        lambda ask: "red",
        args=("--permission-prompt-tool", "stdio"),
        adapter=ClaudeAdapter(permission_prompt_tool="stdio"),
    )
    assert code == 0
    assert_completed(signals)
    assert len(asks(signals)) == 1
    assert (tmp_path / "answer.txt").read_text() == "red\n"


def test_fake_claude_resume_keeps_the_session_and_simple_writes_its_file(tmp_path: Path) -> None:
    signals, code = run_fake_claude(tmp_path, "hello", args=("--resume", "sess-123"))
    assert code == 0
    assert_completed(signals)
    assert SessionId("sess-123") in signals
    assert (tmp_path / "fake-claude.txt").read_text() == "hello\n"


def test_fake_claude_usage_limit_and_garbage(tmp_path: Path) -> None:
    signals, code = run_fake_claude(tmp_path, "scenario:rate_limit")
    assert code == 1
    limited = [s for s in signals if isinstance(s, RateLimited)]
    assert len(limited) == 1 and limited[0].resets_at is not None
    signals, code = run_fake_claude(tmp_path, "scenario:malformed")
    assert code == 0
    assert len([s for s in signals if isinstance(s, Malformed)]) == 1
    assert Activity("text", "Recovered.") in signals
    assert isinstance(signals[-1], Result) and signals[-1].ok


def test_a_claude_run_replayed_after_a_restart_knows_its_final_result(tmp_path: Path) -> None:
    from gridd.runs.output import OutputLog
    from gridd.runs.watch import RunWatch

    (tmp_path / "output.log").write_text(transcript("claude-permission.jsonl"))
    log = OutputLog(tmp_path)
    while log.poll(final=True):
        pass
    run = RunWatch(tmp_path, ClaudeAdapter())
    run.replay(log.seq)
    assert run.result is not None and run.result.ok
    assert run.cost is not None and run.session_id == SID
    # The permission was answered before the restart (its route is the adapter's own
    # business): once that answer is known, the conversation is over.
    assert run.adapter.ends_on_result


def test_claude_continue_heartbeat_nudges_and_a_stall_nudge_can_be_turned_off() -> None:
    from gridd.adapters.base import Nudge

    beat_line = parse_beat('{"status": "continue", "message": "keep going"}')
    assert beat_line is not None
    assert Nudge("continue") in ClaudeAdapter().feed_heartbeat(beat_line)
    assert ClaudeAdapter().stall_nudge() == "continue"
    off = get_adapter("claude", options={"stall_nudge": False})
    assert off.stall_nudge() is None
    assert HeartbeatAdapter().stall_nudge() is None


# -- transcripts captured from the real CLI (2.1.197, tests/transcripts/claude-real-*) --------

#: A moment before the captured five-hour limit resets (its resetsAt is 1795451923).
CAPTURED_AT = 1795448000.0


def test_real_cli_five_hour_limit_is_one_rate_limit_from_its_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gridd.adapters import claude_limits

    monkeypatch.setattr(claude_limits.time, "time", lambda: CAPTURED_AT)
    adapter = ClaudeAdapter()
    signals = feed(adapter, [transcript("claude-real-rate-limit-five-hour.jsonl")])
    [limited] = [s for s in signals if isinstance(s, RateLimited)]
    assert limited.resets_at == 1795451923.0  # the event's epoch, not the prose's minute
    assert (limited.limit_type, limited.source) == ("five_hour", "rate_limit_event")
    assert isinstance(signals[-1], Result) and not signals[-1].ok
    assert adapter.idle()  # the prompt was replayed, the turn is over


def test_real_cli_api_key_429_is_retried_then_parked_for_its_retry_after() -> None:
    from gridd.adapters.base import Retrying

    adapter = ClaudeAdapter()
    before = time.time()
    signals = feed(adapter, [transcript("claude-real-api-retry-429.jsonl")])
    [retry] = [s for s in signals if isinstance(s, Retrying)]
    assert (retry.attempt, retry.max_retries, retry.status, retry.delay) == (1, 1, 429, 1.0)
    [limited] = [s for s in signals if isinstance(s, RateLimited)]
    assert (limited.limit_type, limited.source) == ("api_key", "retry-after")
    assert limited.resets_at is not None and before + 1 <= limited.resets_at <= time.time() + 1


def test_real_cli_write_permission_offers_its_suggestion_and_then_ends() -> None:
    adapter = ClaudeAdapter()
    signals = feed(adapter, [transcript("claude-real-write-permission.jsonl")], every=True)
    (ask,) = asks(signals)
    assert ask.options == ["allow", "deny", ACCEPT_EDITS]
    assert ModelName("claude-opus-4-8[1m]") in signals
    assert [s for s in signals if isinstance(s, Usage)][-1].output_tokens > 0
    assert not adapter.idle()  # its permission is still open
    adapter.encode_answer(ask, "allow")
    assert adapter.idle()  # answered, result seen, prompt replayed: the conversation is over
