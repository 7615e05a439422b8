"""gridctl for agents that wait for a person, and for money: ``questions``, ``answer`` (by
id, and interactively on a real pseudo-terminal), ``respond``, session budgets, and what
``status``, ``agents`` and ``task list`` show about waiting, cost and rate limits.

The CLI runs as a subprocess and starts a real, detached gridd on first use; the ``ws``
fixture stops it and kills any agent left behind. The agent is tests/agents/ask_heartbeat.py,
which asks "Which color?" (red or blue) through its heartbeat file and commits the answer.
The last sections test the interactive walk and the rendering as pure functions.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType

from gridd.cli import questions_cmd, render, render_questions, render_status, render_tasks
from gridd.cli.gridctl import main as gridctl_main
from gridd.cli.gridctl import report
from gridd.errors import Conflict, ValidationFailed
from gridd.model import (
    Agent,
    AgentStatus,
    DaemonInfo,
    Question,
    QuestionStatus,
    RepoState,
    SessionState,
    Stats,
    Task,
    TaskStatus,
)
from tests.support.cli import GRIDCTL, GRIDCTL_ENV, gridctl
from tests.support.git import git_show
from tests.support.processes import daemons_serving
from tests.support.repos import agent_command, write_core_config
from tests.support.waits import wait_for

ASKER = {"command": agent_command("ask_heartbeat.py", "Which color?", "red", "blue")}


def gridctl_on_a_terminal(
    root: Path, *args: str, typed: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """gridctl whose standard input is a pseudo-terminal on which ``typed`` was typed."""
    master, slave = pty.openpty()
    try:
        os.write(master, typed.encode())
        return subprocess.run(
            [*GRIDCTL, *args],
            cwd=root,
            stdin=slave,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=GRIDCTL_ENV,
        )
    finally:
        os.close(slave)
        os.close(master)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def pending(root: Path, count: int) -> list[dict[str, Any]]:
    """The pending questions (``questions --json``), once there are ``count`` of them."""
    found: list[dict[str, Any]] = wait_for(
        lambda: len(q := json.loads(ok(gridctl(root, "questions", "--json")))) == count and q,
        timeout=30,
        interval=0.2,
        message=f"{count} pending question(s)",
    )
    return found


def wait_statuses(root: Path, wanted: dict[str, str]) -> None:
    def check() -> bool:
        tasks = json.loads(ok(gridctl(root, "task", "list", "--json")))
        return {t["id"]: t["status"] for t in tasks} == wanted

    wait_for(check, timeout=30, interval=0.2, message=f"tasks {wanted}")


# -- through the real daemon ---------------------------------------------------------------------


def test_questions_list_answer_by_id_conflicts_and_respond(ws: Path) -> None:
    write_core_config(
        ws, agents={"asker": ASKER}, scheduler={"default_agent": "asker", "max_agents": 2}
    )
    for task_id in ("paint", "draw"):
        ok(gridctl(ws, "task", "add", task_id.title(), "--id", task_id))
    started = ok(gridctl(ws, "session", "start", "--budget", "12.5"))
    assert started == "session started from HEAD with up to 2 agents, budget $12.50\n"
    by_task = {q["taskId"]: q for q in pending(ws, 2)}
    paint, draw = by_task["paint"], by_task["draw"]

    # Piped, as here, the list is tab-separated: a header, then one line per question.
    listed = ok(gridctl(ws, "questions")).splitlines()
    assert listed[0] == "question id\tagent\ttask\ttype\tquestion\toptions\twaited"
    for q in (paint, draw):
        row = next(line for line in listed if line.startswith(f"{q['id']}\t"))
        assert re.fullmatch(
            rf"{q['id']}\t{q['agentId']}\t{q['taskId']}\tclarification\tWhich color\?"
            r"\tred / blue\twaiting \d+s",
            row,
        ), row
    status = ok(gridctl(ws, "status"))
    assert "spent $0.00 of $12.50" in status
    assert "2 tasks waiting for an answer" in status
    assert "pending questions (2)\nquestion id\t" in status
    assert re.search(rf"\n{paint['agentId']}\tpaint\tasker\twaiting \d+s\t", status)
    assert re.search(r"\npaint\tworking, waiting \d+s\t", ok(gridctl(ws, "task", "list")))

    refused = gridctl(ws, "answer", paint["id"], "green")
    assert refused.returncode == 1
    assert refused.stderr == (
        "gridctl: 'green' is not one of the offered options: red, blue [option_not_offered]\n"
        "  offered options:\n    1) red\n    2) blue\n"
    )
    answered = ok(gridctl(ws, "answer", paint["id"], "BLUE"))
    assert answered == f"answered {paint['id']} (task paint, agent {paint['agentId']}): blue\n"
    twice = gridctl(ws, "answer", paint["id"], "red")
    assert twice.returncode == 1
    assert (
        twice.stderr == f"gridctl: question {paint['id']} is already answered [question_answered]\n"
    )

    responded = ok(gridctl(ws, "respond", draw["agentId"], "red"))
    assert responded == f"answered {draw['id']} of agent {draw['agentId']}: red\n"

    wait_statuses(ws, {"paint": "review", "draw": "review"})
    assert git_show(ws, "grid/paint:answer.txt") == "blue\n"
    assert git_show(ws, "grid/draw:answer.txt") == "red\n"
    assert ok(gridctl(ws, "questions")).splitlines()[1:] == []  # the header, no question
    settled = ok(gridctl(ws, "questions", "--all"))
    assert "answered: blue" in settled and "answered: red" in settled
    gone = gridctl(ws, "respond", draw["agentId"], "again")
    assert gone.returncode == 1
    assert "is not running [agent_not_running]" in gone.stderr


def test_interactive_answer_on_a_terminal_picks_a_question_and_an_option(ws: Path) -> None:
    write_core_config(ws, agents={"asker": ASKER}, scheduler={"default_agent": "asker"})
    nothing = gridctl_on_a_terminal(ws, "answer", typed="")
    assert ok(nothing) == "no pending questions\n"

    ok(gridctl(ws, "task", "add", "Paint", "--id", "paint"))
    ok(gridctl(ws, "session", "start"))
    [question] = pending(ws, 1)
    gave_up = gridctl_on_a_terminal(ws, "answer", typed="\x04")  # Ctrl-D at the first prompt
    assert gave_up.returncode == 1
    assert gave_up.stderr.endswith("gridctl: no answer sent\n")
    assert pending(ws, 1) == [question]

    # A wrong number is asked again; Enter takes the first question; "2" is the 2nd option.
    chosen = gridctl_on_a_terminal(ws, "answer", typed="9\n\n2\n")
    out = ok(chosen)
    assert f" 1) {question['id']}  task paint, agent {question['agentId']}" in out
    assert "type a number from 1 to 1" in out
    assert "  1) red\n  2) blue\n" in out
    assert out.endswith(
        f"answered {question['id']} (task paint, agent {question['agentId']}): blue\n"
    )
    wait_statuses(ws, {"paint": "review"})
    assert git_show(ws, "grid/paint:answer.txt") == "blue\n"


def test_answer_without_arguments_off_a_terminal_is_a_usage_error(ws: Path) -> None:
    for argv in (("answer",), ("answer", "q-1")):
        result = gridctl(ws, *argv)
        assert result.returncode == 2
        assert result.stderr.startswith("usage: gridctl answer QUESTION_ID TEXT\n")
        assert "needs a terminal" in result.stderr
    assert not daemons_serving(ws), "a usage error starts no daemon"


def test_session_budget_no_budget_warning_and_stop_reason_in_status(ws: Path) -> None:
    unlimited = gridctl(ws, "session", "start", "--no-budget", "--branch", "feat/money")
    assert ok(unlimited) == "session started on feat/money with up to 3 agents, no budget cap\n"
    assert unlimited.stderr.endswith(
        "gridctl: warning: this session has no budget cap: nothing limits what agents spend\n"
    )
    logged = ok(gridctl(ws, "events", "--types", "session.unbudgeted"))
    assert "nothing limits what agents spend" in logged
    assert "spent $0.00 (no budget cap)" in ok(gridctl(ws, "status"))

    capped = gridctl(ws, "session", "start", "--budget", "$7", "--branch", "feat/money")
    assert ok(capped) == "session started on feat/money with up to 3 agents, budget $7.00\n"
    assert "warning" not in capped.stderr
    budgeted = r"session feat/money +max 3 agents, since .* spent \$0\.00 of \$7\.00"
    assert re.search(budgeted, ok(gridctl(ws, "status")))

    ok(gridctl(ws, "session", "stop"))
    status = ok(gridctl(ws, "status"))
    stopped = r"session stopped \(user: stopped by a person\) \d+s ago +spent \$0\.00 of \$7"
    assert re.search(stopped, status)
    session = json.loads(ok(gridctl(ws, "status", "--json")))["session"]
    assert session["budgetUsd"] == 7.0 and session["stopReason"] == "user"

    for argv in (("--budget", "-1"), ("--budget", "lots"), ("--budget", "3", "--no-budget")):
        refused = gridctl(ws, "session", "start", *argv)
        assert refused.returncode == 2, argv
        assert "Traceback" not in refused.stderr


def test_help_of_the_question_and_budget_commands(capsys: pytest.CaptureFixture[str]) -> None:
    expected = {
        ("questions",): ["--all", "--json"],
        ("answer",): ["QUESTION_ID", "TEXT", "interactively"],
        ("respond",): ["AGENT_ID", "TEXT"],
        ("session", "start"): ["--budget", "--no-budget", "USD"],
    }
    for argv, words in expected.items():
        with pytest.raises(SystemExit) as exited:
            gridctl_main([*argv, "--help"])
        assert exited.value.code == 0
        text = capsys.readouterr().out
        for word in words:
            assert word in text, (argv, word)


# -- the interactive walk, as pure functions ----------------------------------------------

NOW = datetime(2025, 1, 2, 12, 0, tzinfo=UTC)


def _question(qid: str, *options: str, asked_minutes: float = 3, **extra: Any) -> Question:
    return Question(
        id=qid,
        agent_id=f"agent-{qid}",
        task_id=f"task-{qid}",
        question=f"question {qid}?",
        options=list(options),
        asked_at=NOW - timedelta(minutes=asked_minutes),
        **extra,
    )


class Script:
    """Typed lines fed to ``ask`` in order (EOFError after the last); everything shown."""

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)
        self.shown: list[str] = []

    def ask(self, prompt: str) -> str:
        self.shown.append(prompt)
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)

    def say(self, message: str) -> None:
        self.shown.append(message)

    @property
    def text(self) -> str:
        return "\n".join(self.shown)


def test_enter_picks_the_first_question_and_a_number_picks_an_option() -> None:
    questions = [_question("q1", "red", "blue"), _question("q2", "yes", "no", asked_minutes=1)]
    script = Script("", "2")
    picked = questions_cmd.interactive_answer(questions, ask=script.ask, say=script.say, now=NOW)
    assert picked == (questions[0], "blue")
    assert " 1) q1  task task-q1, agent agent-q1, clarification, waiting 3m" in script.text
    assert " 2) q2  task task-q2, agent agent-q2, clarification, waiting 1m" in script.text
    assert "which question? [1-2, Enter for 1] " in script.shown
    assert "  1) red" in script.shown and "  2) blue" in script.shown
    assert not script.lines


def test_a_bad_choice_is_asked_again_and_an_id_also_picks() -> None:
    questions = [_question("q1", "red"), _question("q2", "yes", "no")]
    script = Script("0", "three", "q2", "", "  no  ")
    picked = questions_cmd.interactive_answer(questions, ask=script.ask, say=script.say, now=NOW)
    assert picked == (questions[1], "no")
    assert script.shown.count("type a number from 1 to 2, or press Enter for the first") == 2
    assert "an empty answer is not sent; type one (Ctrl-D to give up)" in script.shown


def test_text_that_is_not_an_option_number_is_sent_as_typed() -> None:
    numeric = _question("q1", "1", "2", "10")
    assert questions_cmd.choose_answer(numeric, ask=Script("10").ask, say=print) == "10"
    assert questions_cmd.choose_answer(numeric, ask=Script("3").ask, say=print) == "10"
    free = _question("q2")
    script = Script("use OAuth, please")
    assert questions_cmd.choose_answer(free, ask=script.ask, say=script.say) == "use OAuth, please"
    assert "answer " in script.shown
    offered = _question("q3", "red", "blue")
    assert questions_cmd.choose_answer(offered, ask=Script("green").ask, say=print) == "green"


def test_no_questions_says_so_and_end_of_input_gives_up() -> None:
    script = Script()
    assert questions_cmd.interactive_answer([], ask=script.ask, say=script.say) is None
    assert script.shown == ["no pending questions"]
    with pytest.raises(EOFError):
        questions_cmd.interactive_answer(
            [_question("q1", "a")], ask=Script("").ask, say=lambda _: None, now=NOW
        )


def test_refused_answers_print_the_offered_options_and_why_a_question_closed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report(
        ValidationFailed(
            "'x' is not one of the offered options: a, b",
            code="option_not_offered",
            details={"options": ["a", "b"]},
        )
    )
    report(
        Conflict(
            "question q1 is already closed",
            code="question_closed",
            details={"status": "closed", "closedReason": "agent exited"},
        )
    )
    assert capsys.readouterr().err == (
        "gridctl: 'x' is not one of the offered options: a, b [option_not_offered]\n"
        "  offered options:\n    1) a\n    2) b\n"
        "gridctl: question q1 is already closed [question_closed]\n"
        "  closed because: agent exited\n"
    )


# -- rendering, without a daemon -----------------------------------------------------------------


def _text(renderable: RenderableType) -> str:
    console = Console(record=True, width=220, force_terminal=True)
    console.print(renderable)
    return console.export_text()


def _state(**changes: Any) -> RepoState:
    base: dict[str, Any] = {
        "session": SessionState(),
        "tasks": [],
        "agents": [],
        "pending_questions": [],
        "stats": Stats(),
        "daemon": DaemonInfo(
            version="1",
            api_version=1,
            pid=1,
            uptime=1,
            workspace="/w",
            started_at=NOW,
            last_event_id=0,
            subscribers=0,
        ),
    }
    return RepoState(**{**base, **changes})


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-3, "0s"), (45, "45s"), (200, "3m"), (3600, "1h"), (7500, "2h 5m"), (97200, "1d 3h")],
)
def test_brief_waits_read_at_a_glance(seconds: float, text: str) -> None:
    assert render.brief(seconds) == text


def test_money_has_cents_and_keeps_fractions_of_one() -> None:
    amounts = [render.money(v) for v in (None, 0.0, 3.2, 0.0042, 1234.5)]
    assert amounts == ["-", "$0.00", "$3.20", "$0.0042", "$1,234.50"]


def test_status_shows_budget_waiting_rate_limits_and_question_waits() -> None:
    agent = Agent(
        id="a1",
        task_id="t1",
        profile="claude",
        worktree_path="/w",
        status=AgentStatus.WAITING,
        started_at=NOW - timedelta(minutes=10),
        waiting_since=NOW - timedelta(minutes=3),
        activity="Edit",
        message="src/login.py",
        cost_usd=0.42,
        session_number=2,
    )
    stalled = agent.model_copy(
        update={"id": "a2", "status": AgentStatus.RUNNING, "stalled": True, "cost_usd": None}
    )
    parked = Task(
        id="t2", title="t2", status=TaskStatus.RATE_LIMITED, resume_at=NOW + timedelta(minutes=12)
    )
    state = _state(
        session=SessionState(started=True, feature_branch="feat/x", budget_usd=50.0),
        tasks=[Task(id="t1", title="t1", status=TaskStatus.WORKING), parked],
        agents=[agent, stalled],
        pending_questions=[_question("q1", "y", "n")],
        stats=Stats(working=1, rate_limited=1, waiting=1, spent_usd=3.2),
    )
    text = _text(render_status.status_view(state, now=NOW))
    assert "session feat/x  max 3 agents  spent $3.20 of $50.00" in text
    notes = (
        r"\n1 task waiting for an answer; 1 rate limited,"
        r" the first resumes at \d\d:\d\d:\d\d \(in 12m\)\n"
    )
    waiting = (
        r"a1 +│ t1 \(session 2\) +│ claude +│ waiting 3m +│ - +│ 10m 0s +│ \$0\.42"
        r" +│ Edit: src/login\.py"
    )
    stalled_row = r"a2 +│ t1 \(session 2\) +│ claude +│ running, stalled +│"
    asked = r"q1 +│ agent-q1 +│ task-q1 +│ clarification +│ question q1\? +│ y / n +│ waiting 3m"
    for pattern in (notes, waiting, stalled_row, asked):
        assert re.search(pattern, text), pattern
    line = render_status.summary_line(state)
    assert line.endswith("; 1 question waiting; spent $3.20 of $50.00")


def test_a_stopped_session_shows_why_and_what_it_spent() -> None:
    session = SessionState(
        budget_usd=5.0, spent_usd=5.1, stop_reason="budget_exhausted", stopped_at=NOW
    )
    state = _state(session=session, stats=Stats(spent_usd=5.1))
    text = _text(render_status.status_view(state, now=NOW + timedelta(seconds=90)))
    why = "session stopped (budget_exhausted: the budget is spent) 1m 30s ago  spent $5.10 of $5"
    assert why in text
    assert render_status.summary_line(state).startswith("no session (stopped: budget_exhausted), 0")


def test_a_session_stopped_for_lack_of_agent_work_points_at_the_tasks_waiting_for_review() -> None:
    session = SessionState(stop_reason="no_work", stopped_at=NOW)
    state = _state(session=session, stats=Stats(review=2, done=1))
    text = _text(render_status.status_view(state, now=NOW + timedelta(seconds=5)))
    assert (
        "session stopped (no_work: no work was left for agents; 2 in review wait for you"
        " (gridctl task approve)) 5s ago" in text
    )
    idle = _text(render_status.status_view(_state(session=session, stats=Stats(done=3)), now=NOW))
    assert "session stopped (no_work: no work was left for agents) 0s ago" in idle


def test_task_list_and_show_have_sessions_cost_waiting_and_resume_time() -> None:
    waiting = Task(
        id="t1",
        title="t1",
        status=TaskStatus.WORKING,
        sessions=2,
        max_sessions=4,
        cost_usd=1.5,
        waiting_since=NOW - timedelta(seconds=200),
        summary="did half",
    )
    parked = Task(id="t2", title="t2", status=TaskStatus.RATE_LIMITED, resume_at=NOW)
    table = _text(render_tasks.task_table([waiting, parked], now=NOW))
    row = r"t1 +│ working, waiting 3m +│ +2 │ - +│ \(default\) +│ 0/3 +│ 2/4 +│ \$1\.50"
    assert re.search(row, table), table
    assert re.search(r"t2 +│ rate_limited until \d\d:\d\d:\d\d \(due\) +│", table)
    shown = _text(render_tasks.task_detail(waiting))
    for name, value in (("sessions", "2 of 4"), ("cost", "$1.50"), ("summary", "did half")):
        assert re.search(rf"^{name} +{re.escape(value)}", shown, re.M), name
    assert "waiting since" in shown
    assert "max sessions" not in shown and "cost usd" not in shown


def test_a_narrow_terminal_keeps_task_ids_whole_and_drops_the_least_needed_columns() -> None:
    tasks = [
        Task(id="write-hello-0a7f3c", title="w", depends_on=["setup-project-1b2c3d"]),
        Task(id="setup-project-1b2c3d", title="s", branch="grid/setup-project-1b2c3d"),
    ]
    console = Console(record=True, width=80, force_terminal=True)
    console.print(render_tasks.task_table(tasks, now=NOW))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    header = text.splitlines()[2]
    for kept in ("id", "status", "pri", "deps", "attempts"):
        assert f" {kept} " in header, kept
    assert "branch" not in header and "sessions" not in header
    assert "write-hello-0a7f3c " in text and "setup-project-1b2c3d " in text  # never cut
    assert "…" not in text
    wide = _text(render_tasks.task_table(tasks, now=NOW))  # 220 columns: all of them
    assert all(f" {name} " in wide for name in (*render_tasks.TASK_COLUMNS, "updated"))


def test_the_questions_table_with_all_shows_answers_and_close_reasons() -> None:
    answered = _question(
        "q1",
        "red",
        status=QuestionStatus.ANSWERED,
        answer="red",
        answered_at=NOW - timedelta(minutes=1),
    )
    closed = _question("q2", status=QuestionStatus.CLOSED, closed_reason="agent exited")
    text = _text(render_questions.questions_table([answered, closed], title="questions", now=NOW))
    assert re.search(r"q1 .*│ red +│ answered after 2m +│ answered: red", text)
    assert re.search(r"q2 .*│ - +│ asked 3m 0s ago +│ closed: agent exited", text)
    assert "no questions" in _text(render_questions.questions_table([], empty="no questions"))
