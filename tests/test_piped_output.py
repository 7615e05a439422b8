"""Output that fits where it goes: piped, every list command prints a tab-separated header
line and one line per record, whole (never cut or wrapped at 80 columns), with no box
drawing; on a terminal too narrow for a table, each record becomes a block of
``column  value`` lines instead of a table of words wrapped one per line.

The end-to-end test runs the real CLI with its output captured (a pipe, as in a script or
a CI log) and no ``COLUMNS``: rich would lay it out for 80 columns. Its agent asks a
question through its heartbeat file, so the session has an agent and a pending question.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console

from gridd.cli import render_questions
from gridd.model import Question
from tests.support.cli import GRIDCTL
from tests.support.repos import agent_command, write_core_config
from tests.support.waits import wait_for

#: A pipe in CI: no terminal anywhere and no COLUMNS.
PIPE_ENV = {key: value for key, value in os.environ.items() if key not in {"COLUMNS", "LINES"}}
LONG_ID = "a-task-whose-id-is-long-enough-to-go-past-eighty-columns-alone"
QUESTION = "Which colour should the front door be painted, given the brick and the window frames?"
BOX = set("│┃━─┏┓┗┛┡┩└┘┼╇")


def gridctl(root: Path, *args: str, env: dict[str, str] = PIPE_ENV) -> str:
    result = subprocess.run(
        [*GRIDCTL, *args],
        cwd=root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def assert_tab_separated(out: str, header: list[str]) -> list[list[str]]:
    """Every line has the header's fields; the records, split."""
    lines = out.splitlines()
    assert lines[0].split("\t") == header
    records = [line.split("\t") for line in lines[1:]]
    assert all(len(record) == len(header) for record in records), out
    assert not BOX & set(out), out
    return records


def test_every_list_command_prints_tab_separated_lines_when_piped(ws: Path) -> None:
    asker = {"command": agent_command("ask_heartbeat.py", QUESTION, "red", "blue")}
    write_core_config(ws, agents={"asker": asker}, scheduler={"default_agent": "asker"})
    gridctl(ws, "task", "add", "Paint", "--id", "paint")
    gridctl(ws, "task", "add", "Then", "--id", LONG_ID, "--depends-on", "paint")
    gridctl(ws, "session", "start")
    wait_for(
        lambda: json.loads(gridctl(ws, "questions", "--json")),
        timeout=30,
        interval=0.2,
        message="the agent's question",
    )

    task_header = ["id", "status", "pri", "deps", "agent", "attempts", "sessions", "cost"]
    task_header += ["branch", "updated"]
    for command in (("task", "list"), ("tasks", "list")):
        records = assert_tab_separated(gridctl(ws, *command), task_header)
        by_id = {record[0]: record for record in records}
        assert by_id[LONG_ID][1:4] == ["pending", "2", "paint"]  # whole, past 80 columns
        assert by_id["paint"][1].startswith("working")

    question_header = ["question id", "agent", "task", "type", "question", "options", "waited"]
    (question,) = assert_tab_separated(gridctl(ws, "questions"), question_header)
    assert question[2:6] == ["paint", "clarification", QUESTION, "red / blue"]
    settled = assert_tab_separated(gridctl(ws, "questions", "--all"), question_header)
    assert [record[4] for record in settled] == [QUESTION]

    agent_header = ["agent", "task", "profile", "status", "pid", "running for", "cost"]
    agent_header += ["activity", "last output"]
    (agent,) = assert_tab_separated(gridctl(ws, "agents"), agent_header)
    assert agent[1:3] == ["paint", "asker"] and agent[3].startswith("waiting")

    status = gridctl(ws, "status")
    assert not BOX & set(status), status
    assert "\nagents (1)\nagent\ttask\tprofile\t" in status
    assert "\npending questions (1)\nquestion id\tagent\ttask\ttype\tquestion\t" in status
    assert f"\tpaint\tclarification\t{QUESTION}\tred / blue\t" in status


def test_empty_lists_piped_print_only_their_header(ws: Path) -> None:
    header = ["id", "status", "pri", "deps", "agent", "attempts", "sessions", "cost", "branch"]
    assert gridctl(ws, "task", "list") == "\t".join([*header, "updated"]) + "\n"
    assert gridctl(ws, "questions").startswith("question id\tagent\t")
    assert gridctl(ws, "agents").startswith("agent\ttask\t")
    status = gridctl(ws, "status")
    assert "no agents" in status and "no pending questions" in status


def test_a_table_too_wide_for_the_terminal_becomes_one_block_per_record() -> None:
    now = datetime.now(UTC)
    question = Question(
        id="q-1",
        agent_id="asker-1",
        task_id="paint",
        type="clarification",
        question=QUESTION,
        options=["red", "blue", "green with a touch of grey"],
        asked_at=now - timedelta(seconds=30),
    )
    console = Console(record=True, width=80, force_terminal=True)
    console.print(
        render_questions.questions_table([question, question.model_copy(update={"id": "q-2"})])
    )
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].strip() == "pending questions (2)"
    fields = {line.split()[0]: line for line in lines if line.strip()}
    assert fields["options"].split(None, 1)[1].strip() == "red / blue / green with a touch of grey"
    assert [line.split()[-1] for line in lines if line.startswith("question id")] == ["q-1", "q-2"]
    # The question wraps in its block, a line of words at a time, not a word per line.
    start = next(i for i, line in enumerate(lines) if line.startswith("question  "))
    assert len(lines[start].split()) > 5
    # With room, it is a table.
    wide = Console(record=True, width=200, force_terminal=True)
    wide.print(render_questions.questions_table([question]))
    assert "┃ question id ┃" in wide.export_text()
