"""A newer CLI's output, read by the real daemon: a message type the adapter does not know,
and fields it does not know on the types it does, are skipped without a warning, and the
run finishes as the same output without them would, with the same session and cost.

Each agent prints a transcript captured from its real CLI (``tests/transcripts/``) with an
unknown message put in mid-stream and an unknown field added to every message. The unknown
message carries what would mislead an adapter that read it: another session id, a cost,
tokens, a result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gridd.adapters.prices import PRICES
from tests.real_cli import agent_of
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.repos import write_core_config
from tests.support.sse import event_log

TRANSCRIPTS = Path(__file__).parent / "transcripts"
#: Prints the file named by its first argument; ignores the rest (what extra_args adds).
PRINT = "import sys; sys.stdout.write(open(sys.argv[1]).read())"

CODEX = PRICES["gpt-5-codex"]
GEMINI = PRICES["gemini-2.5-pro"]
CASES = {
    # adapter: (transcript, profile extras, session id, cost)
    "claude": (
        "claude-real-write-allowed.jsonl",
        {"stdin": "pipe"},
        "184aa724-1381-478b-af17-3781b4afef7c",
        0.00068,
    ),
    "codex": (
        "codex-real-write.jsonl",
        {"stdin": "null", "adapter_options": {"model": "gpt-5-codex"}},
        "01a216ba-4f51-77c0-b645-3d5630b67b49",
        (2400 * CODEX.input + 160 * CODEX.output) / 1e6,
    ),
    "gemini": (
        "gemini-real-write.jsonl",
        {"stdin": "null"},
        "f1379ed2-4d57-4ebc-b8da-c83bb4b8068b",
        (2000 * GEMINI.input + 100 * GEMINI.output) / 1e6,
    ),
    "opencode": (
        "opencode-real-write.jsonl",
        {"stdin": "null"},
        "ses_de929eb4cffexus65lL0ujJK2E",
        2 * 0.000255,
    ),
}


def with_unknowns(transcript: str, adapter: str) -> str:
    """The transcript with an unknown field on each message and an unknown message in the
    middle of them."""
    lines = transcript.splitlines()
    out: list[str] = []
    for line in lines:
        if line.startswith("{"):
            message = json.loads(line)
            message["x_added_later"] = {"nested": [1, {"type": "result"}]}
            line = json.dumps(message)
        out.append(line)
    misleading = {
        "type": f"{adapter}_future_message",
        "subtype": "success",
        "session_id": "not-this-session",
        "sessionID": "ses_not_this_session",
        "thread_id": "not-this-thread",
        "total_cost_usd": 99.0,
        "cost": 99.0,
        "usage": {"input_tokens": 10**6, "output_tokens": 10**6},
        "result": "not the result",
        "is_error": True,
    }
    out.insert(len(out) // 2, json.dumps(misleading))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("adapter", sorted(CASES))
def test_an_unknown_message_mid_stream_is_skipped_and_the_run_finishes_with_its_cost(
    repo: Path, tmp_path: Path, adapter: str
) -> None:
    name, extras, session, cost = CASES[adapter]
    printed = tmp_path / name
    printed.write_text(with_unknowns((TRANSCRIPTS / name).read_text(), adapter))
    profile = {"adapter": adapter, "command": [sys.executable, "-c", PRINT, str(printed)]}
    write_core_config(
        repo, agents={adapter: {**profile, **extras}}, scheduler={"default_agent": adapter}
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "newer", "title": "newer", "prompt": "do the task"})
        c.post("/session/start", {"featureBranch": "feature/newer"})
        wait_task_status(c, "newer", "review", timeout=60)
        agent = agent_of(c, "newer")
        assert agent["exitCode"] == 0 and agent["status"] == "exited"
        assert agent["sessionId"] == session
        assert agent["costUsd"] == pytest.approx(cost)
        assert c.get("/tasks/newer")["costUsd"] == pytest.approx(cost)
        assert agent["result"] != "not the result"
        assert not event_log(c, types={"agent.warning"})
