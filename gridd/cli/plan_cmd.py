"""``gridctl plan ...``: plan files (many tasks with dependencies) applied at once, and waves.

A plan file is YAML: a mapping with a ``tasks:`` list, or a bare list, of task specs
(``dependsOn``, also spelt ``depends_on`` or ``after``). It is parsed here, so a typo is
reported with its line and column before anything is sent, validated with the daemon's own
request model, then posted as JSON; the daemon applies it atomically or not at all. Waves
of a file are computed locally with the pure ``gridd.plan`` functions, without a daemon.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml
from pydantic import ValidationError

from gridd.cli import render_tasks
from gridd.cli.context import EXIT_OK, Command, Context, group
from gridd.errors import GriddError, ValidationFailed
from gridd.plan import graph_problems, waves
from gridd.specs import PlanSpec, TaskSpec, normalise_plan

_SHAPE = "a plan is a mapping with a 'tasks:' list, or a bare list of tasks"


def read_plan(path: str) -> tuple[str, Any]:
    """``(name, data)``: the file (``-`` is standard input) parsed as YAML and normalised."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise GriddError(f"cannot read {name}: {reason}", code="plan_unreadable") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or "unreadable"
        details = {"line": mark.line + 1, "column": mark.column + 1} if mark else {}
        raise GriddError(
            f"{name}: not valid YAML: {where}{problem}", code="plan_malformed_yaml", details=details
        ) from None
    except yaml.YAMLError as exc:
        raise GriddError(f"{name}: not valid YAML: {exc}", code="plan_malformed_yaml") from None
    data = normalise_plan(data)
    if not (isinstance(data, dict) and isinstance(data.get("tasks"), list)):
        raise GriddError(f"{name}: {_SHAPE}", code="plan_bad_shape")
    # YAML has dates and other types JSON lacks: send what a person would read.
    return name, json.loads(json.dumps(data, default=str))


def _task_name(data: Any, index: int) -> str:
    tasks = data.get("tasks") if isinstance(data, dict) else None
    item = tasks[index] if isinstance(tasks, list) and index < len(tasks) else None
    label = ""
    if isinstance(item, dict):
        label = str(item.get("id") or item.get("title") or "")
    return f"task #{index + 1}" + (f" ({label})" if label else "")


def check_plan(name: str, data: Any) -> PlanSpec:
    """The plan validated with the daemon's model; every problem named by task, or raised."""
    try:
        return PlanSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = list(err["loc"])
            where = "plan"
            if len(loc) >= 2 and loc[0] == "tasks" and isinstance(loc[1], int):
                where, loc = _task_name(data, loc[1]), loc[2:]
            elif loc[:1] == ["tasks"]:
                loc = loc[1:]
            field = ".".join(str(part) for part in loc)
            problems.append({"message": f"{where}: {field + ': ' if field else ''}{err['msg']}"})
        raise ValidationFailed(
            f"{name}: {len(problems)} problem{'s' if len(problems) != 1 else ''} in the plan",
            code="plan_invalid",
            details={"problems": problems},
        ) from None


def _ids(tasks: list[TaskSpec]) -> list[str]:
    # A task without an id gets one from the daemon; here it is known by its position.
    return [spec.id or f"#{index + 1}" for index, spec in enumerate(tasks)]


# -- apply ------------------------------------------------------------------------------------


def build_apply(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE.yaml", help="the plan file to load ('-' for standard input)"
    )


def run_apply(ctx: Context) -> int:
    name, data = read_plan(ctx.args.file)
    plan = check_plan(name, data)
    result = ctx.client().post("/plans", data)
    applied = sum(len(wave) for wave in result["waves"])
    titles = {spec.id: spec.title for spec in plan.tasks if spec.id}
    print(f"applied {name}: {applied} task{'s' if applied != 1 else ''}")
    print(render_tasks.waves_text(result["waves"], statuses=result.get("statuses"), titles=titles))
    return EXIT_OK


# -- show ------------------------------------------------------------------------------------


def build_show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help="compute the waves of this plan file locally, without the daemon, as if the"
        " workspace had no other tasks (default: show the daemon's tasks)",
    )


def run_show(ctx: Context) -> int:
    if ctx.args.file is not None:
        return _show_file(ctx.args.file)
    client = ctx.client()
    plan = client.get("/plan")
    titles = {task["id"]: task["title"] for task in client.get("/tasks")}
    print(render_tasks.waves_text(plan["waves"], statuses=plan.get("statuses"), titles=titles))
    return EXIT_OK


def _show_file(path: str) -> int:
    name, data = read_plan(path)
    plan = check_plan(name, data)
    ids = _ids(plan.tasks)
    graph = [(task_id, spec.depends_on) for task_id, spec in zip(ids, plan.tasks, strict=True)]
    problems = graph_problems(graph)
    if problems:
        raise ValidationFailed(
            f"{name}: {len(problems)} problem{'s' if len(problems) != 1 else ''} in the plan",
            code=f"plan_{problems[0].kind}",
            details={
                "problems": [
                    {"kind": p.kind, "message": p.message, "ids": list(p.ids)} for p in problems
                ]
            },
        )
    titles = {task_id: spec.title for task_id, spec in zip(ids, plan.tasks, strict=True)}
    print(render_tasks.waves_text(waves(dict(graph)), titles=titles))
    return EXIT_OK


PLAN = group(
    "apply a plan file, or show waves",
    {
        "apply": Command(
            help="load a YAML plan of many tasks with dependencies, atomically",
            description="Load every task of a YAML plan file at once. A cycle, an unknown"
            " dependency or a duplicate id is refused with every problem listed (exit 1), and"
            " nothing is applied. Prints the waves (topological levels) of the new tasks."
            " Each task: id, title, prompt, priority, dependsOn (or depends_on, after),"
            " labels, agent, maxAttempts, timeoutSeconds.",
            build=build_apply,
            run=run_apply,
        ),
        "show": Command(
            help="print the waves of the daemon's tasks (with status), or of a plan file",
            description="Print the tasks in waves: wave 1 depends on nothing, wave n only on"
            " earlier waves. Without FILE, the daemon's tasks with their status; with FILE,"
            " that plan checked and layered locally (no daemon needed), or its problems"
            " (exit 1).",
            build=build_show,
            run=run_show,
        ),
    },
    description="Plans: many tasks with dependencies, loaded at once and shown in waves.",
)
