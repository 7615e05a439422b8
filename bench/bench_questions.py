"""Questions and answers: how fast a question reaches a human, and an answer the agent.

A real daemon runs one agent, ``bench/agents/ask_loop.py``, under the default
``heartbeat`` adapter. It asks 20 questions in turn (10 with ``--quick``), each after a
random pause of 0-50 ms (so questions fall at random points of the daemon's 20 ms polling
cycle rather than all just after a poll): for each it stamps ``time.monotonic()``, appends a ``{"status": "question", ...}`` line to
``$GRID_HEARTBEAT`` and blocks reading its answer on stdin, stamping the moment the line
is read; the stamps go to a side file. The benchmark follows ``GET /events`` with a raw
reader (a thread here, stamping each event's arrival with the same system-wide clock) and
answers each ``agent.question`` at once with ``POST /agents/{id}/respond``.

- **question latency**: heartbeat line written -> ``agent.question`` at the SSE client.
  Target: median <= 50 ms.
- **answer latency**: ``POST /agents/{id}/respond`` sent -> the agent has read the line.
  Target: median <= 50 ms.

Baseline (same run, no gridd): the same write -> read of one line through a plain FIFO
between two threads of this process, 200 times (it is microseconds, and noisy). Ratio: gridd's question-latency median /
the FIFO's median (the answer-latency ratio is in the figures).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import PYTHON, ROOT, Check, RawHTTP, median, percentile, result
from bench.harness import EventTap, agent_daemon, api, request

NAME = "questions"
QUESTIONS = 20
QUESTIONS_QUICK = 10
TARGET_MS = 50.0
FIFO_LINES = 200
THINK_S = 0.05  # the agent's random pause before each question: 0..THINK_S
AGENT = ROOT / "bench" / "agents" / "ask_loop.py"


def _fifo_baseline(n: int) -> list[float]:
    """Write one line into a FIFO, stamp when a blocked reader thread has read it."""
    with tempfile.TemporaryDirectory(prefix="gbq", dir="/tmp") as tmp:
        path = Path(tmp) / "fifo"
        os.mkfifo(path)
        read_at: list[float] = []
        got = threading.Event()

        def reader() -> None:
            with open(path) as fh:
                while fh.readline():
                    read_at.append(time.monotonic())
                    got.set()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        latencies = []
        with open(path, "w") as out:
            for i in range(n):
                got.clear()
                written = time.monotonic()
                out.write(f"answer {i}\n")
                out.flush()
                if not got.wait(5):
                    raise RuntimeError("the FIFO reader did not read the line")
                latencies.append(read_at[-1] - written)
        thread.join(5)
    return latencies


def _gridd(n: int, times_file: Path) -> dict[str, Any]:
    agents = {"asker": {"command": [PYTHON, str(AGENT), str(n), str(times_file), str(THINK_S)]}}
    arrived: dict[int, float] = {}
    posted: dict[int, float] = {}
    with (
        agent_daemon(agents, default_agent="asker") as daemon,
        RawHTTP(daemon.sock, timeout=10) as http,
        EventTap(
            daemon.sock,
            types=["agent.question", "agent.completed", "agent.failed", "task.start_failed"],
        ) as tap,
    ):
        api(http, "POST", "/tasks", {"id": "asker", "title": "ask questions"})
        api(http, "POST", "/tasks/asker/start")
        for _ in range(n):
            at, event = tap.expect(lambda e: True, timeout=20)
            if event.type != "agent.question":
                raise RuntimeError(f"expected a question, got {event.type}: {event.data}")
            i = int(event.data["question"].split()[-1])
            arrived[i] = at
            posted[i] = time.monotonic()
            status, body = request(
                http, "POST", f"/agents/{event.data['agentId']}/respond", {"response": "a"}
            )
            if status != 200:
                raise RuntimeError(f"respond -> {status}: {body}")
        _, end = tap.expect(lambda e: e.type != "agent.question", timeout=20)
        if end.type != "agent.completed":
            raise RuntimeError(f"the agent did not complete: {end.type} {end.data}")
    asked: dict[int, float] = {}
    read: dict[int, float] = {}
    for line in times_file.read_text().splitlines():
        rec = json.loads(line)
        if "asked" in rec:
            asked[rec["i"]] = rec["asked"]
        else:
            read[rec["i"]] = rec["read"]
    return {
        "question": [arrived[i] - asked[i] for i in range(n)],
        "answer": [read[i] - posted[i] for i in range(n)],
    }


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(median(values) * 1000, 3),
        "p90": round(percentile(values, 90) * 1000, 3),
        "max": round(max(values) * 1000, 3),
    }


def run(quick: bool) -> dict[str, Any]:
    n = QUESTIONS_QUICK if quick else QUESTIONS
    fifo = _fifo_baseline(FIFO_LINES)
    with tempfile.TemporaryDirectory(prefix="gbq", dir="/tmp") as tmp:
        gridd = _gridd(n, Path(tmp) / "times.ndjson")
    q_ms = median(gridd["question"]) * 1000
    a_ms = median(gridd["answer"]) * 1000
    fifo_ms = median(fifo) * 1000
    return result(
        name=NAME,
        title=f"questions: {n} heartbeat questions asked and answered",
        checks=[
            Check(
                metric="question latency: heartbeat written -> agent.question at SSE client",
                value=round(q_ms, 2),
                unit="ms",
                target=f"median <= {TARGET_MS:g} ms",
                passed=q_ms <= TARGET_MS,
            ),
            Check(
                metric="answer latency: POST /respond -> line read by the agent",
                value=round(a_ms, 2),
                unit="ms",
                target=f"median <= {TARGET_MS:g} ms",
                passed=a_ms <= TARGET_MS,
            ),
        ],
        baseline={
            "what": "one line written to a plain FIFO -> read by a blocked thread (no gridd)",
            "value": round(fifo_ms, 4),
            "unit": "ms",
        },
        ratio=q_ms / fifo_ms,
        ratio_label="question-latency median / FIFO median",
        figures={
            "questions": n,
            "question_ms": _ms(gridd["question"]),
            "answer_ms": _ms(gridd["answer"]),
            "fifo_ms": _ms(fifo),
            "answer_ratio": round(a_ms / fifo_ms, 1),
        },
        quick=quick,
        summary=f"question {q_ms:.1f} ms, answer {a_ms:.1f} ms (medians of {n}); plain FIFO"
        f" {fifo_ms * 1000:.0f} us",
        notes="stamps are time.monotonic() in the agent and in the benchmark (one clock)",
    )
