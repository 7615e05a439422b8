"""Every mistake answered helpfully: an unknown ``gridctl`` option or plan field is answered
with the closest known one, and a plan's problems are all told at once, each with its line
and its path in the file (``tasks[2].depends_on[0]``).

The option and ``plan show FILE`` cases run gridctl in-process (neither needs a daemon); the
``plan apply`` case runs the real CLI against a real gridd, which knows the workspace's tasks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridd.cli import plan_cmd
from gridd.cli.gridctl import EXIT_ERROR, EXIT_USAGE, build_parser
from gridd.cli.gridctl import main as gridctl_main
from gridd.cli.tasks_cmd import task_spec
from tests.support import cli as support_cli

#: A cycle (a -> c -> b -> a), an unknown dependency (ghost) and a misspelt field.
THREE_PROBLEMS = """\
tasks:
  - id: a
    title: A
    depends_on: [c]
  - id: b
    title: B
    after: a
    priorty: 1
  - id: c
    title: C
    depends_on:
      - b
      - ghost
"""


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        gridctl_main(argv)
    assert exited.value.code == EXIT_USAGE
    return capsys.readouterr().err


def test_an_unknown_option_is_answered_by_its_command_with_the_closest_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _usage_error(["task", "add", "A title", "--priorty", "1"], capsys)
    assert "gridctl task add: error: unknown option --priorty; did you mean --priority?" in err
    assert err.startswith("usage: gridctl task add ")  # its own usage, not the top level's

    err = _usage_error(["session", "start", "--maxagents", "3", "--budjet=5"], capsys)
    assert (
        "gridctl session start: error: unknown options --maxagents (did you mean"
        " --max-agents?), --budjet (did you mean --budget?)" in err
    )

    err = _usage_error(["--no-strat", "status"], capsys)
    assert "gridctl: error: unknown option --no-strat; did you mean --no-start?" in err


def test_an_option_like_none_points_to_the_commands_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _usage_error(["task", "list", "--zzz"], capsys)
    assert "gridctl task list: error: unknown option --zzz (see gridctl task list --help)" in err
    # An extra argument that is not an option is still called what it is.
    err = _usage_error(["task", "show", "one", "two"], capsys)
    assert "gridctl task show: error: unrecognized arguments: two" in err


def _plan_show(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = gridctl_main(["--no-start", "plan", "show", str(path)])
    return code, capsys.readouterr().err


def test_an_unknown_plan_field_is_answered_with_the_closest_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "- {id: one, title: One}\n- id: two\n  title: Two\n  dependson: [one]\n  maxAttemps: 2\n"
    )
    code, err = _plan_show(plan, capsys)
    assert code == EXIT_ERROR
    assert err.splitlines() == [
        f"gridctl: {plan}: 2 problems in the plan [plan_invalid]",
        "  - line 4, [1].dependson: unknown field 'dependson'; did you mean 'depends_on'?",
        "  - line 5, [1].maxAttemps: unknown field 'maxAttemps'; did you mean 'maxAttempts'?",
    ]
    plan.write_text("task:\n  - {title: One}\n")
    code, err = _plan_show(plan, capsys)
    assert code == EXIT_ERROR
    assert "('task:' is not 'tasks:')" in err


def test_a_plan_with_a_cycle_an_unknown_dependency_and_a_bad_field_reports_all_three(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(THREE_PROBLEMS)
    code, err = _plan_show(plan, capsys)
    assert code == EXIT_ERROR
    lines = err.splitlines()
    assert lines[0] == f"gridctl: {plan}: 3 problems in the plan [plan_invalid]"
    assert lines[1] == "  - line 4, tasks[0].depends_on[0]: dependency cycle: a -> c -> b -> a"
    assert (
        lines[2]
        == "  - line 8, tasks[1].priorty: unknown field 'priorty'; did you mean 'priority'?"
    )
    assert (
        lines[3] == "  - line 13, tasks[2].depends_on[1]: task 'c' depends on unknown task 'ghost'"
    )
    assert len(lines) == 4
    assert "Traceback" not in err


def test_plan_apply_reports_every_problem_judging_dependencies_by_the_workspaces_tasks(
    ws: Path,
) -> None:
    env = {**support_cli.GRIDCTL_ENV, "COLUMNS": "200"}
    added = support_cli.gridctl(ws, "task", "add", "Exists", "--id", "ghost", env=env)
    assert added.returncode == 0, added.stderr
    (ws / "plan.yaml").write_text(THREE_PROBLEMS.replace("- ghost", "- ghost\n      - nowhere"))
    result = support_cli.gridctl(ws, "plan", "apply", "plan.yaml", env=env)
    assert result.returncode == EXIT_ERROR
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
    assert problems == [
        "  - line 4, tasks[0].depends_on[0]: dependency cycle: a -> c -> b -> a",
        "  - line 8, tasks[1].priorty: unknown field 'priorty'; did you mean 'priority'?",
        "  - line 14, tasks[2].depends_on[2]: task 'c' depends on unknown task 'nowhere'",
    ]
    listed = support_cli.gridctl(ws, "task", "list", "--json", env=env)
    assert [task["id"] for task in json.loads(listed.stdout)] == ["ghost"]  # nothing applied


def test_the_daemons_graph_problems_are_placed_in_the_file(ws: Path) -> None:
    env = {**support_cli.GRIDCTL_ENV, "COLUMNS": "200"}
    assert (
        support_cli.gridctl(ws, "task", "add", "Exists", "--id", "taken", env=env).returncode == 0
    )
    (ws / "plan.yaml").write_text(
        "tasks:\n  - {id: fine, title: F}\n  - {id: taken, title: again}\n"
        "  - id: lost\n    title: L\n    after: [fine, nowhere]\n"
    )
    result = support_cli.gridctl(ws, "plan", "apply", "plan.yaml", env=env)
    assert result.returncode == EXIT_ERROR
    assert result.stderr.splitlines() == [
        "gridctl: plan.yaml: 2 problems in the plan [task_exists]",
        "  - line 3, tasks[1].id: duplicate task id 'taken'",
        "  - line 6, tasks[2].after[1]: task 'lost' depends on unknown task 'nowhere'",
    ]


def test_dependencies_are_spelt_depends_on_and_after_still_works(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["task", "add", "T", "--depends-on", "a,b", "--after", "c", "--depends-on", "d"]
    )
    assert task_spec(args)["dependsOn"] == ["a", "b", "c", "d"]
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "- {id: a, title: A}\n- {id: b, title: B, depends_on: a}\n"
        "- {id: c, title: C, dependsOn: [a]}\n- {id: d, title: D, after: [b, c]}\n"
    )
    data = plan_cmd.read_plan(str(plan)).data
    assert [task.get("dependsOn") for task in data["tasks"]] == [None, ["a"], ["a"], ["b", "c"]]
