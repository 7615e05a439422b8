"""``gridctl plan ...``: plan files (many tasks with dependencies) applied at once, and waves.

A plan file is YAML: a mapping with a ``tasks:`` list, or a bare list, of task specs
(docs/plans.md). Dependencies are ``depends_on``, also spelt ``dependsOn``, ``after`` or
``deps``, as ``gridctl task add --depends-on`` is also ``--after``. It is parsed here, so a typo is
reported with its line and column before anything is sent, validated with the daemon's own
request model, then posted as JSON; the daemon applies it atomically or not at all. Waves
of a file are computed locally with the pure ``gridd.plan`` functions, without a daemon.

Every problem is told at once (bad fields, with the closest known name for an unknown one,
and the dependency graph's duplicates, unknown dependencies and cycle), each with its line
and its path as the file spells it: ``line 14, tasks[2].depends_on[1]: ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel, to_snake
from pydantic_core import ErrorDetails

from gridd.cli import render_tasks
from gridd.cli.context import EXIT_OK, Command, Context, group
from gridd.errors import GriddError, ValidationFailed
from gridd.ids import task_id_problem
from gridd.plan import GraphProblem, graph_problems, waves
from gridd.specs import PlanSpec, TaskSpec, normalise_plan
from gridd.spelling import closest, did_you_mean

_SHAPE = "a plan is a mapping with a 'tasks:' list, or a bare list of tasks"
#: Every spelling of a task's dependencies in a plan file (``normalise_plan`` makes them one).
_DEPENDENCY_KEYS = ("depends_on", "dependsOn", "after", "deps")


@dataclass(frozen=True)
class PlanFile:
    """A plan file as read: what it says (``raw``), what is sent (``data``, normalised),
    and its YAML nodes, which give each problem its line."""

    name: str
    raw: Any
    data: Any
    node: yaml.Node | None = None


def read_plan(path: str) -> PlanFile:
    """The file (``-`` is standard input) parsed as YAML and normalised."""
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
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
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
    finally:
        loader.dispose()
    # YAML has dates and other types JSON lacks: send what a person would read.
    raw = json.loads(json.dumps(data, default=str))
    normalised = normalise_plan(raw)
    if not (isinstance(normalised, dict) and isinstance(normalised.get("tasks"), list)):
        near = [key for key in raw if closest(str(key), ["tasks"])] if isinstance(raw, dict) else []
        hint = f" ('{near[0]}:' is not 'tasks:')" if near and "tasks" not in raw else ""
        raise GriddError(f"{name}: {_SHAPE}{hint}", code="plan_bad_shape")
    return PlanFile(name, raw, normalised, node)


# -- where a problem is in the file ------------------------------------------------------------


def _as_written(item: Any, field: str) -> str:
    """The key the file used for ``field`` of a task (``depends_on`` for ``dependsOn``)."""
    if isinstance(item, dict):
        spellings = (
            _DEPENDENCY_KEYS
            if field in _DEPENDENCY_KEYS
            else (field, to_snake(field), to_camel(field))
        )
        for key in item:
            if key in spellings:
                return str(key)
    return field


def _place(plan: PlanFile, loc: Sequence[str | int]) -> tuple[str, int | None]:
    """``("tasks[2].depends_on[0]", line)`` for a location in the normalised plan, as the
    file spells it, with the line it is on (the nearest line that exists)."""
    bare = isinstance(plan.raw, list)
    parts: list[str | int] = []
    items = plan.raw if bare else plan.raw.get("tasks")
    rest = list(loc)
    if rest[:1] == ["tasks"]:
        rest = rest[1:]
        if not bare:
            parts.append("tasks")
        if rest and isinstance(rest[0], int):
            index = int(rest.pop(0))
            parts.append(index)
            item = items[index] if isinstance(items, list) and index < len(items) else None
            if rest:
                key = _as_written(item, str(rest.pop(0)))
                parts.append(key)
                value = item.get(key) if isinstance(item, dict) else None
                # One dependency may be written without a list: its index is not in the file.
                if rest and isinstance(rest[0], int) and not isinstance(value, list):
                    rest.pop(0)
    parts.extend(rest)
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    return text or "(the plan)", _line(plan.node, parts)


def _line(node: yaml.Node | None, parts: Sequence[str | int]) -> int | None:
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in parts:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    line, child = key.start_mark.line + 1, value
                    break
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


def _problem(
    plan: PlanFile, loc: Sequence[str | int], message: str, **extra: Any
) -> dict[str, Any]:
    path, line = _place(plan, loc)
    where = f"line {line}, {path}" if line is not None else path
    return {"message": f"{where}: {message}", "path": path, "line": line, **extra}


def _field_message(plan: PlanFile, err: ErrorDetails) -> str:
    """pydantic's message, with a suggestion for an unknown field."""
    loc = err["loc"]
    if err["type"] != "extra_forbidden":
        return err["msg"].removeprefix("Value error, ")
    model = TaskSpec if len(loc) == 3 and loc[0] == "tasks" else PlanSpec
    known = [spelling for name in model.model_fields for spelling in (name, to_camel(name))]
    if model is TaskSpec:
        known += _DEPENDENCY_KEYS
    name = str(loc[-1])
    return f"unknown field {name!r}" + (
        did_you_mean(name, known) or f" (known: {', '.join(sorted(model.model_fields))})"
    )


def _graph(plan: PlanFile) -> list[tuple[str, list[str]]]:
    """``(id, dependencies)`` of each task as far as the file says them (a task without an
    id is known by its position, ``#1``: nothing can depend on it)."""
    graph = []
    for index, item in enumerate(plan.data["tasks"]):
        item = item if isinstance(item, dict) else {}
        task_id = item.get("id")
        deps = item.get("dependsOn")
        graph.append(
            (
                task_id if isinstance(task_id, str) and task_id else f"#{index + 1}",
                # An invalid id is reported as that, not also as a task that does not exist.
                [dep for dep in deps if isinstance(dep, str) and not task_id_problem(dep)]
                if isinstance(deps, list)
                else [],
            )
        )
    return graph


def _graph_loc(
    kind: str, ids: Sequence[str], graph: list[tuple[str, list[str]]]
) -> list[str | int]:
    """Where a graph problem is: the id, or the dependency, that makes it."""
    positions = [index for index, (task_id, _deps) in enumerate(graph) if task_id == ids[0]]
    if not positions:
        return ["tasks"]
    if kind == "duplicate":
        index = positions[1] if len(positions) > 1 else positions[0]
        return ["tasks", index, "id"]
    index = positions[0]
    target = {"self_dependency": ids[0], "unknown_dependency": ids[-1]}.get(kind)
    if kind == "cycle":
        target = ids[1] if len(ids) > 1 else ids[0]
    deps = graph[index][1]
    if target in deps:
        return ["tasks", index, "dependsOn", deps.index(target)]
    return ["tasks", index]


def graph_problem_list(
    plan: PlanFile, problems: Sequence[GraphProblem | dict[str, Any]]
) -> list[dict[str, Any]]:
    """Dependency-graph problems (found here or by the daemon) with their places in the file."""
    graph = _graph(plan)
    placed = []
    for problem in problems:
        if isinstance(problem, GraphProblem):
            kind, message, ids = problem.kind, problem.message, list(problem.ids)
        else:
            kind, message = str(problem.get("kind", "")), str(problem.get("message", ""))
            ids = [str(i) for i in problem.get("ids") or []]
        loc = _graph_loc(kind, ids, graph) if ids else ["tasks"]
        placed.append(_problem(plan, loc, message, kind=kind, ids=ids))
    return placed


def check_plan(plan: PlanFile, *, existing: Mapping[str, Sequence[str]] | None = None) -> PlanSpec:
    """The plan validated with the daemon's model and its dependency graph checked, or
    every problem raised at once, each with its place in the file. ``existing`` is the
    workspace's tasks (id -> dependencies) the plan may depend on; with None they are not
    known, and a dependency on a task not in the file is not judged."""
    problems = []
    spec: PlanSpec | None = None
    try:
        spec = PlanSpec.model_validate(plan.data)
    except ValidationError as exc:
        problems = [_problem(plan, err["loc"], _field_message(plan, err)) for err in exc.errors()]
    found = graph_problems(_graph(plan), existing or {})
    if existing is None:
        found = [p for p in found if p.kind != "unknown_dependency"]
    problems += graph_problem_list(plan, found)
    problems.sort(key=lambda problem: problem["line"] or 0)
    if problems or spec is None:
        raise ValidationFailed(
            f"{plan.name}: {len(problems)} problem{'s' if len(problems) != 1 else ''} in the plan",
            code="plan_invalid",
            details={"problems": problems},
        )
    return spec


def _ids(tasks: list[TaskSpec]) -> list[str]:
    # A task without an id gets one from the daemon; here it is known by its position.
    return [spec.id or f"#{index + 1}" for index, spec in enumerate(tasks)]


# -- apply ------------------------------------------------------------------------------------


def build_apply(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE.yaml", help="the plan file to load ('-' for standard input)"
    )


def run_apply(ctx: Context) -> int:
    plan = read_plan(ctx.args.file)
    try:
        spec = check_plan(plan)
    except ValidationFailed:
        # Whether a dependency names a task is for the workspace's tasks to say: ask them,
        # so that every problem is told at once.
        tasks = ctx.client().get("/tasks")
        check_plan(plan, existing={task["id"]: task["dependsOn"] for task in tasks})
        raise
    try:
        result = ctx.client().post("/plans", plan.data)
    except GriddError as exc:
        problems = exc.details.get("problems") if isinstance(exc.details, dict) else None
        if not (isinstance(problems, list) and all("ids" in p for p in problems)):
            raise
        # The daemon's graph problems (against the workspace's tasks), placed in the file.
        placed = graph_problem_list(plan, problems)
        raise type(exc)(
            f"{plan.name}: {len(placed)} problem{'s' if len(placed) != 1 else ''} in the plan",
            code=exc.code,
            details={**exc.details, "problems": placed},
        ) from None
    applied = sum(len(wave) for wave in result["waves"])
    titles = {task.id: task.title for task in spec.tasks if task.id}
    print(f"applied {plan.name}: {applied} task{'s' if applied != 1 else ''}")
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
    plan = read_plan(path)
    spec = check_plan(plan, existing={})
    ids = _ids(spec.tasks)
    graph = [(task_id, task.depends_on) for task_id, task in zip(ids, spec.tasks, strict=True)]
    titles = {task_id: task.title for task_id, task in zip(ids, spec.tasks, strict=True)}
    print(render_tasks.waves_text(waves(dict(graph)), titles=titles))
    return EXIT_OK


PLAN = group(
    "apply a plan file, or show waves",
    {
        "apply": Command(
            help="load a YAML plan of many tasks with dependencies, atomically",
            description="Load every task of a YAML plan file at once. A cycle, an unknown"
            " dependency or a duplicate id is refused with every problem listed (exit 1), and"
            " nothing is applied; each problem names its line and path in the file."
            " Prints the waves (topological levels) of the new tasks."
            " Each task: id, title, prompt, priority, depends_on (or dependsOn, after),"
            " agent, files, labels, max_attempts, max_sessions, timeout_seconds"
            " (docs/plans.md).",
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
