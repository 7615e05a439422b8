"""gridctl's core-loop commands, end to end: tasks, plans, the session, agents, logs, watch.

The real CLI runs as a subprocess and starts a real, detached gridd on first use (with
``GRID_EXAMPLE_DELAY=0`` in its environment so the bundled example agent is quick); the
``ws`` fixture stops that daemon and kills any agent left behind. The last section checks
the pure pieces (rendering, plan files, idleness) without any process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from gridd.cli import plan_cmd, render_tasks, watch
from gridd.cli.gridctl import main as gridctl_main
from gridd.errors import GriddError
from gridd.model import DaemonInfo, RepoState, SessionState, Stats, Task, TaskStatus, utcnow
from tests.support import cli as support_cli
from tests.support.cli import GRIDCTL
from tests.support.processes import daemons_serving
from tests.support.repos import agent_command, write_core_config
from tests.support.waits import wait_for

ENV = {**os.environ, "COLUMNS": "200", "GRID_EXAMPLE_DELAY": "0"}

THREE_WAVES = """\
# a roof needs both wings, and both wings need the base
tasks:
  - id: base
    title: Lay the base
    prompt: pour the concrete
  - id: left
    title: Left wing
    after: base
  - id: right
    title: Right wing
    depends_on: [base]
    priority: 1
  - id: roof
    title: The roof
    dependsOn: [left, right]
"""

CYCLE = """\
- {id: alpha, title: A, after: gamma}
- {id: beta, title: B, after: alpha}
- {id: gamma, title: C, after: beta}
- {id: free, title: not in the cycle}
"""


def gridctl(
    root: Path, *args: str, timeout: float = 30, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return support_cli.gridctl(root, *args, timeout=timeout, cwd=cwd, env=ENV)


class Background:
    """gridctl running in the background, its output collected line by line as it comes."""

    def __init__(self, root: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*GRIDCTL, *args],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**ENV, "PYTHONFAULTHANDLER": "1"},
            # A background child may inherit SIGINT as ignored; some tests send Ctrl-C.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(stream, into), daemon=True)
            for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_line(self, lines: list[str], text: str, timeout: float = 15) -> None:
        wait_for(lambda: any(text in line for line in lines), timeout=timeout, message=text)

    def finish(self, timeout: float = 30) -> tuple[int, str, str]:
        """Exit status, stdout and stderr once it has exited by itself."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: show where it hung
            self.proc.wait(10)
            for reader in self._readers:
                reader.join(5)
            pytest.fail(f"{self.proc.args!r} did not finish:\n{''.join(self.err)}")
        for reader in self._readers:
            reader.join(10)
        return code, "".join(self.out), "".join(self.err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def tasks_json(root: Path) -> list[dict[str, Any]]:
    result = gridctl(root, "task", "list", "--json")
    assert result.returncode == 0, result.stderr
    tasks: list[dict[str, Any]] = json.loads(result.stdout)
    return tasks


# -- tasks ------------------------------------------------------------------------------------------


def test_task_add_list_show_cancel_round_trip(ws: Path) -> None:
    first = gridctl(
        ws,
        "task", "add", "Write the parser",
        "--id", "parser",
        "--prompt", "parse [bold]everything[/bold]",
        "--priority", "1",
        "--label", "core", "--label", "v1",
        "--max-attempts", "2",
        "--timeout", "90",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert first.stdout == "created task parser (ready)\n"
    second = gridctl(ws, "task", "add", "Test the parser", "--after", "parser", "-q")
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.strip()
    assert second_id.startswith("test-the-parser")

    listed = gridctl(ws, "task", "list")
    assert listed.returncode == 0, listed.stderr
    # Piped, as here: tab-separated, a header line then a line per task.
    rows = {line.split("\t")[0]: line.split("\t") for line in listed.stdout.splitlines()}
    assert rows["id"][:6] == ["id", "status", "pri", "deps", "agent", "attempts"]
    assert rows["parser"][:6] == ["parser", "ready", "1", "-", "(default)", "0/2"]
    assert rows[second_id][1:4] == ["pending", "2", "parser"]

    pending = gridctl(ws, "task", "list", "--status", "pending,blocked", "--json")
    assert [t["id"] for t in json.loads(pending.stdout)] == [second_id]
    bad_status = gridctl(ws, "task", "list", "--status", "sleeping")
    assert bad_status.returncode == 2
    assert "unknown status sleeping" in bad_status.stderr

    shown = gridctl(ws, "task", "show", "parser")
    assert shown.returncode == 0, shown.stderr
    for text in ("Write the parser", "core, v1", "0 of 2", "1m 30s", "changed files (0)"):
        assert text in shown.stdout
    assert "parse [bold]everything[/bold]" in shown.stdout  # printed, not read as markup
    raw = json.loads(gridctl(ws, "task", "show", "parser", "--json").stdout)
    assert raw["labels"] == ["core", "v1"] and raw["timeoutSeconds"] == 90

    cancelled = gridctl(ws, "task", "cancel", "parser")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == "task parser cancelled: now cancelled\n"
    again = gridctl(ws, "task", "cancel", "parser")
    assert again.returncode == 1
    assert again.stderr == "gridctl: task 'parser' is already cancelled [task_finished]\n"
    missing = gridctl(ws, "task", "show", "nope")
    assert missing.returncode == 1
    assert "no task 'nope'" in missing.stderr


def test_an_id_holding_slashes_or_dots_is_answered_as_a_bad_id_never_as_a_missing_endpoint(
    ws: Path,
) -> None:
    assert gridctl(ws, "daemon", "start").returncode == 0
    for task_id in ("../../etc", "a/b", "..", ".", ""):
        shown = gridctl(ws, "task", "show", task_id)
        assert shown.returncode == 1
        assert shown.stderr == (
            f"gridctl: invalid task id {task_id!r}: must match [a-z0-9][a-z0-9._-]{{0,63}}"
            " [invalid_task_id]\n"
        )
    approved = gridctl(ws, "task", "approve", "../x")
    assert approved.stderr.endswith("[invalid_task_id]\n"), approved.stderr
    killed = gridctl(ws, "agent", "kill", "../x")
    assert killed.stderr == "gridctl: no agent '../x' [agent_not_found]\n"
    answered = gridctl(ws, "answer", "..", "yes")  # '..' reaches the daemon, which says so
    assert answered.stderr == "gridctl: no question '..' [question_not_found]\n"
    logs = gridctl(ws, "logs", "a/b")
    assert "no agent or task 'a/b'" in logs.stderr


def test_task_add_after_an_unknown_task_exits_1_naming_it(ws: Path) -> None:
    result = gridctl(ws, "task", "add", "Orphan", "--id", "orphan", "--after", "ghost")
    assert result.returncode == 1
    assert "task 'orphan' depends on unknown task 'ghost'" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert tasks_json(ws) == []


# -- plans ------------------------------------------------------------------------------------------


def test_plan_apply_three_waves_then_plan_show_prints_them_in_order(ws: Path) -> None:
    (ws / "plan.yaml").write_text(THREE_WAVES)
    applied = gridctl(ws, "plan", "apply", "plan.yaml")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines()[0] == "applied plan.yaml: 4 tasks"

    shown = gridctl(ws, "plan", "show")
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines()]
    assert [line[:3] for line in lines] == [
        ["wave", "1", "(1"],
        ["base", "ready", "Lay"],
        ["wave", "2", "(2"],
        ["left", "pending", "Left"],
        ["right", "pending", "Right"],
        ["wave", "3", "(1"],
        ["roof", "pending", "The"],
    ]
    assert applied.stdout.splitlines()[1:] == shown.stdout.splitlines()
    by_id = {t["id"]: t for t in tasks_json(ws)}
    assert by_id["right"]["dependsOn"] == ["base"] and by_id["right"]["priority"] == 1
    assert by_id["base"]["prompt"] == "pour the concrete"


def test_plan_apply_of_a_cycle_exits_1_naming_it_and_applies_nothing(ws: Path) -> None:
    (ws / "cycle.yaml").write_text(CYCLE)
    result = gridctl(ws, "plan", "apply", "cycle.yaml")
    assert result.returncode == 1
    assert "dependency cycle: " in result.stderr
    cycle = re.search(r"dependency cycle: ([a-z]+(?: -> [a-z]+)+)", result.stderr)
    assert cycle is not None
    assert set(cycle.group(1).split(" -> ")) == {"alpha", "beta", "gamma"}
    assert "Traceback" not in result.stderr
    assert tasks_json(ws) == []


def test_plan_apply_lists_every_problem(ws: Path) -> None:
    assert gridctl(ws, "task", "add", "Exists", "--id", "taken").returncode == 0
    (ws / "plan.yaml").write_text(
        "tasks:\n  - {id: taken, title: again}\n  - {id: lost, title: x, after: nowhere}\n"
    )
    result = gridctl(ws, "plan", "apply", "plan.yaml")
    assert result.returncode == 1
    assert "  - line 2, tasks[0].id: duplicate task id 'taken'" in result.stderr
    assert (
        "  - line 3, tasks[1].after: task 'lost' depends on unknown task 'nowhere'" in result.stderr
    )
    assert [t["id"] for t in tasks_json(ws)] == ["taken"]


def test_plan_apply_of_bad_yaml_exits_1_with_the_line_and_does_not_start_gridd(ws: Path) -> None:
    (ws / "bad.yaml").write_text("tasks:\n  - id: a\n    title: [unclosed\n  - id: b\n")
    result = gridctl(ws, "plan", "apply", "bad.yaml")
    assert result.returncode == 1
    assert result.stderr.startswith("gridctl: bad.yaml: not valid YAML: line 4, column ")
    assert "Traceback" not in result.stderr
    (ws / "shape.yaml").write_text("title: not a plan\n")
    shape = gridctl(ws, "plan", "apply", "shape.yaml")
    assert shape.returncode == 1
    assert "a mapping with a 'tasks:' list" in shape.stderr
    assert not daemons_serving(ws)
    invalid = ws / "invalid.yaml"
    invalid.write_text("- {id: ok, title: fine}\n- {id: Bad!, title: x, priority: 9}\n")
    problems = gridctl(ws, "plan", "apply", str(invalid))
    assert problems.returncode == 1
    assert "2 problems" in problems.stderr
    assert "  - line 2, [1].id: invalid task id 'Bad!'" in problems.stderr
    assert "  - line 2, [1].priority: " in problems.stderr


def test_plan_show_of_a_file_works_offline(ws: Path) -> None:
    (ws / "plan.yaml").write_text(THREE_WAVES)
    result = gridctl(ws, "--no-start", "plan", "show", "plan.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "wave 1 (1 task)",
        "  base   Lay the base",
        "wave 2 (2 tasks)",
        "  left   Left wing",
        "  right  Right wing",
        "wave 3 (1 task)",
        "  roof   The roof",
    ]
    (ws / "cycle.yaml").write_text(CYCLE)
    cyclic = gridctl(ws, "plan", "show", "cycle.yaml", "--no-start")
    assert cyclic.returncode == 1
    assert "dependency cycle: " in cyclic.stderr
    unknown = ws / "unknown.yaml"
    unknown.write_text("- {title: no id, after: [ghost]}\n")
    missing = gridctl(ws, "plan", "show", str(unknown))
    assert missing.returncode == 1
    assert "task '#1' depends on unknown task 'ghost'" in missing.stderr
    # The daemon-side show needs the daemon.
    assert gridctl(ws, "--no-start", "plan", "show").returncode == 3
    assert not daemons_serving(ws)


# -- the session, agents, logs and the live view ---------------------------------------------------


def test_session_runs_tasks_to_review_and_logs_and_watch_follow_them(ws: Path) -> None:
    write_core_config(ws)
    (ws / "plan.yaml").write_text(
        "- {id: one, title: First, prompt: make one}\n"
        "- {id: two, title: Second, prompt: make two}\n"
        "- {id: three, title: Third, after: one}\n"
    )
    assert gridctl(ws, "plan", "apply", "plan.yaml").returncode == 0
    # Follow a task whose agent does not exist yet: it waits for agent.spawned.
    follower = Background(ws, "logs", "--follow", "one")
    follower.wait_line(follower.err, "waiting for an agent to start on task one")
    started = gridctl(ws, "session", "start", "--max-agents", "2", "--branch", "feat")
    assert started.returncode == 0, started.stderr
    assert started.stdout == "session started on feat with up to 2 agents, budget $50.00\n"

    # 'three' waits for 'one' to be approved: nothing moves without a person, so it ends.
    watched = gridctl(ws, "status", "--watch", "--until-idle", timeout=60)
    assert watched.returncode == 0, watched.stderr
    assert "review 2" in watched.stdout.splitlines()[-1]
    assert "pending 1" in watched.stdout.splitlines()[-1]

    code, out, err = follower.finish()
    assert code == 0, err
    assert out.startswith("[example:one] prompt: make one\n")
    assert out.endswith("[example:one] done\n")

    logs = gridctl(ws, "logs", "two")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith("[example:two] prompt: make two\n")  # raw, no decoration
    assert logs.stdout.endswith("[example:two] done\n")
    later = gridctl(ws, "logs", "two", "--since", "1")
    assert later.returncode == 0, later.stderr
    assert logs.stdout.endswith(later.stdout) and len(later.stdout) < len(logs.stdout)
    assert gridctl(ws, "logs", "three").returncode == 1  # no agent yet, and no --follow

    shown = gridctl(ws, "task", "show", "one")
    assert "review" in shown.stdout and "notes/one.md" in shown.stdout
    refused = gridctl(ws, "task", "start", "three")
    assert refused.returncode == 1
    assert "waits for unfinished dependencies: one" in refused.stderr

    agents = gridctl(ws, "agents", "--all", "--json")
    assert sorted(a["taskId"] for a in json.loads(agents.stdout)) == ["one", "two"]
    running = gridctl(ws, "agents").stdout  # piped: the header, and no record
    assert running.splitlines() == [running.splitlines()[0]] and running.startswith("agent\t")

    approved = gridctl(ws, "task", "approve", "one")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout == "task one approved: now merging (queued for the merge)\n"
    stopped = gridctl(ws, "session", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("session stopped")


def test_logs_follow_prints_a_running_agent_until_it_exits(ws: Path, tmp_path: Path) -> None:
    control = tmp_path
    write_core_config(
        ws, agents={"ticker": {"command": agent_command("ticker.py", str(control), "0.02")}}
    )
    assert gridctl(ws, "task", "add", "Tick", "--id", "tk", "--agent", "ticker").returncode == 0
    assert gridctl(ws, "task", "start", "tk").returncode == 0
    wait_for(
        lambda: "tk tick 5\n" in gridctl(ws, "logs", "tk").stdout,
        timeout=20,
        interval=0.2,
        message="the ticker's fifth tick",
    )
    follower = Background(ws, "logs", "-f", "tk")
    # Live output keeps coming while it follows, before the agent is told to finish.
    wait_for(lambda: len(follower.out) > 20, timeout=15, message="live ticks")
    (control / "tk.go").touch()
    code, out, err = follower.finish()
    assert code == 0, err
    assert "agent ticker-1 exited (completed)" in err
    got = out.splitlines(keepends=True)
    ticks = [int(line.split()[-1]) for line in got[:-1]]
    assert ticks == list(range(1, len(ticks) + 1)), "every tick once, in order, from the start"
    assert got[-1] == f"tk last tick {ticks[-1]}\n"

    # Kill a second agent; following it then ends by itself.
    assert gridctl(ws, "task", "add", "Tock", "--id", "tock", "--agent", "ticker").returncode == 0
    assert gridctl(ws, "task", "start", "tock").returncode == 0
    agent_id = wait_for(
        lambda: [a["id"] for a in json.loads(gridctl(ws, "agents", "--json").stdout)],
        timeout=20,
        message="the second agent",
    )[0]
    killed = gridctl(ws, "agent", "kill", agent_id)
    assert killed.returncode == 0, killed.stderr
    assert f"killing agent {agent_id}" in killed.stdout
    followed = gridctl(ws, "logs", "-f", agent_id)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.startswith("tock tick 1\n")
    wait_for(lambda: "blocked" in gridctl(ws, "task", "show", "tock").stdout, timeout=15)
    assert gridctl(ws, "agent", "kill", "nobody").returncode == 1


def test_logs_follow_and_watch_exit_0_on_ctrl_c(ws: Path) -> None:
    assert gridctl(ws, "task", "add", "Waits", "--id", "waits").returncode == 0
    follower, watcher = Background(ws, "logs", "-f", "waits"), Background(ws, "status", "-w")
    try:
        follower.wait_line(follower.err, "waiting for an agent")
        watcher.wait_line(watcher.out, "no session")  # a summary line, not a live screen
        for each in (follower, watcher):
            each.proc.send_signal(signal.SIGINT)
        for each in (follower, watcher):
            code, _, err = each.finish(timeout=15)
            assert code == 0, err
            assert "Traceback" not in err
    finally:
        follower.kill()
        watcher.kill()


def test_watch_refuses_json_and_logs_of_nothing_exits_1(ws: Path) -> None:
    assert gridctl(ws, "status", "--watch", "--json").returncode == 2
    missing = gridctl(ws, "logs", "ghost")
    assert missing.returncode == 1
    assert "no agent or task 'ghost'" in missing.stderr


def _help(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        gridctl_main([*argv, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_help_of_the_new_commands_describes_their_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    top = _help((), capsys)
    for command in ("task", "plan", "session", "agents", "agent", "logs", "status"):
        assert command in top
    expected = {
        ("task", "add"): ["--id", "--prompt", "--prompt-file", "--after", "--priority", "--agent",
                          "--label", "--max-attempts", "--timeout", "--no-start"],
        ("task", "list"): ["--status", "--json"],
        ("task", "show"): ["--json"],
        ("task", "approve"): ["ID", "--all"],
        ("task", "reject"): ["ID", "--feedback"],
        ("task", "diff"): ["ID", "--stat"],
        ("plan", "apply"): ["FILE.yaml"],
        ("plan", "show"): ["FILE"],
        ("session", "start"): ["--branch", "--base", "--on-conflict", "--max-agents"],
        ("session", "stop"): ["--force"],
        ("agents",): ["--all", "--json"],
        ("agent", "kill"): ["AGENT_ID"],
        ("logs",): ["--follow", "--since", "AGENT_OR_TASK"],
        ("status",): ["--watch", "--until-idle", "--json"],
    }  # fmt: skip
    for argv, flags in expected.items():
        text = _help(argv, capsys)
        for flag in flags:
            assert flag in text, (argv, flag)
    task_help = _help(("task",), capsys)
    for action in ("add", "list", "show", "cancel", "start", "stop", "approve"):
        assert action in task_help


def test_gridctl_imports_no_daemon_side_module() -> None:
    code = (
        "import sys, gridd.cli.gridctl;"
        "bad = sorted(m for m in sys.modules if m.split('.')[:2] in ("
        "['gridd', 'daemon'], ['gridd', 'service'], ['gridd', 'api'],"
        " ['gridd', 'scheduler'], ['gridd', 'pool']));"
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [*GRIDCTL[:1], "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == ""


# -- the pure pieces ----------------------------------------------------------------------------


def _state(*tasks: Task) -> RepoState:
    return RepoState(
        session=SessionState(),
        tasks=list(tasks),
        agents=[],
        pending_questions=[],
        stats=Stats(),
        daemon=DaemonInfo(
            version="0",
            api_version=1,
            pid=1,
            uptime=1.0,
            workspace="/w",
            started_at=utcnow(),
            last_event_id=0,
            subscribers=0,
        ),
    )


def _task(task_id: str, status: TaskStatus, *deps: str) -> Task:
    return Task(id=task_id, title=task_id, status=status, depends_on=list(deps))


@pytest.mark.parametrize(
    ("tasks", "idle"),
    [
        ([], True),
        ([_task("a", TaskStatus.REVIEW), _task("b", TaskStatus.PENDING, "a")], True),
        ([_task("a", TaskStatus.FAILED), _task("b", TaskStatus.BLOCKED, "a")], True),
        ([_task("a", TaskStatus.DONE), _task("b", TaskStatus.PENDING, "a")], False),
        ([_task("a", TaskStatus.READY)], False),
        ([_task("a", TaskStatus.WORKING)], False),
        ([_task("a", TaskStatus.RATE_LIMITED)], False),
    ],
    ids=["empty", "waits-on-review", "failed", "about-to-be-ready", "ready", "working", "parked"],
)
def test_idle_means_nothing_moves_without_a_person(tasks: list[Task], idle: bool) -> None:
    assert watch.idle(_state(*tasks)) is idle


def test_waves_text_aligns_ids_statuses_and_titles() -> None:
    text = render_tasks.waves_text(
        [["a", "bbb"], ["c"]],
        statuses={"a": "done", "bbb": "review", "c": "pending"},
        titles={"a": "first  one", "c": "third"},
    )
    assert text.splitlines() == [
        "wave 1 (2 tasks)",
        "  a    done     first one",
        "  bbb  review",
        "wave 2 (1 task)",
        "  c    pending  third",
    ]
    assert render_tasks.waves_text([]) == "no tasks"


def test_read_plan_reports_yaml_errors_with_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("tasks:\n  - id: a\n\ttitle: tab\n")
    with pytest.raises(GriddError) as info:
        plan_cmd.read_plan(str(bad))
    assert info.value.code == "plan_malformed_yaml"
    assert info.value.details["line"] == 3
    assert f"{bad}: not valid YAML: line 3, column 1: " in info.value.message
    dated = tmp_path / "d.yaml"
    dated.write_text("- {id: d, title: 2024-01-02, deps: x}\n")
    assert plan_cmd.read_plan(str(dated)).data == {
        "tasks": [{"id": "d", "title": "2024-01-02", "dependsOn": ["x"]}]
    }
    with pytest.raises(GriddError, match="cannot read"):
        plan_cmd.read_plan(str(tmp_path / "missing.yaml"))
