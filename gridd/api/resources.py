"""Routes for tasks, plans, the session, agents and questions (covend's paths, plus ours)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gridd.api.body import read_document
from gridd.api.bulk import answered_big, validate_plan, wire_many
from gridd.api.errors import query_flag, query_int, read_body, read_json, validate
from gridd.api.paging import PAGE_QUERY, page_of, paged
from gridd.api.spec import grid_of, table, wire
from gridd.errors import BadRequest, ValidationFailed
from gridd.git import diff, report
from gridd.git.diff import TaskDiff
from gridd.git.report import FeatureReport
from gridd.model import (
    Agent,
    ConflictItem,
    Question,
    SessionState,
    Task,
    TaskStatus,
    WireModel,
)
from gridd.scheduler import describe
from gridd.specs import (
    Approve,
    PlanSpec,
    Reject,
    Respond,
    SessionStart,
    TaskPatch,
    TaskSpec,
    normalise_plan,
)


class Waves(WireModel):
    waves: list[list[str]]
    statuses: dict[str, str] = Field(default_factory=dict)


class AgentOutput(WireModel):
    agent_id: str
    task_id: str
    seq: int
    chunks: list[dict[str, Any]]
    more: bool


class TaskList(BaseModel):
    tasks: list[Task]


def _task_id(request: Request) -> str:
    return str(request.path_params["task_id"])


def _id_of(item: Task | Agent | Question) -> str:
    return item.id


def _agent_id(request: Request) -> str:
    return str(request.path_params["agent_id"])


# -- tasks ------------------------------------------------------------------------------------


@table.add(
    "GET",
    "/tasks",
    summary="All tasks (?status=ready,working filters; ?limit&after pages)",
    response=Task,
    response_list=True,
    query={"status": "comma-separated statuses", **PAGE_QUERY},
)
async def list_tasks(request: Request) -> Response:
    grid = grid_of(request)
    raw = request.query_params.get("status")
    if not raw:
        if paged(request):
            return page_of(request, list(grid.state.tasks.values()), key=_id_of)
        return Response(grid.state.tasks_json(), media_type="application/json")
    try:
        wanted = {TaskStatus(s.strip()) for s in raw.split(",") if s.strip()}
    except ValueError:
        raise BadRequest(
            f"unknown status in {raw!r}; known: {', '.join(s.value for s in TaskStatus)}",
            code="bad_query",
        ) from None
    matching = [t for t in grid.state.tasks.values() if t.status in wanted]
    if paged(request):
        return page_of(request, matching, key=_id_of)
    return wire(matching)  # type: ignore[arg-type]


@table.add(
    "POST",
    "/tasks",
    summary="Create one task, or a list of tasks atomically",
    body=TaskSpec,
    body_list=True,
    response=Task,
    response_list=True,
    status=201,
)
async def create_tasks(request: Request) -> Response:
    data = await read_json(request)
    if data is None:
        raise BadRequest(
            "request body required: a task object or a list of them", code="empty_body"
        )
    # Problems name places in the body as it was sent: "priority", or "0.priority" in a list.
    single = isinstance(data, dict)
    if single:
        specs = [validate(TaskSpec, data)]
    elif isinstance(data, list):
        plan = await validate_plan({"tasks": data}, within="tasks")
        specs = plan.tasks
        del data, plan  # a big body's parsed form is not kept while the tasks are built
    else:
        problem = "the body must be a task object or a list of them"
        raise ValidationFailed(
            f"invalid request: {problem}",
            details={"problems": [{"field": "(body)", "problem": problem}]},
        )
    created = await grid_of(request).commands.create_tasks_yielding(specs)
    if single:
        return wire(created[0], status=201)
    return wire_many(list(created), status=201)


@table.add("GET", "/tasks/{task_id}", summary="One task", response=Task)
async def get_task(request: Request) -> Response:
    return wire(grid_of(request).commands.task(_task_id(request)))


@table.add(
    "PATCH", "/tasks/{task_id}", summary="Change a task's fields", body=TaskPatch, response=Task
)
async def patch_task(request: Request) -> Response:
    patch = await read_body(request, TaskPatch)
    return wire(grid_of(request).commands.patch_task(_task_id(request), patch))


@table.add(
    "DELETE", "/tasks/{task_id}", summary="Cancel a task (its agent is stopped)", response=Task
)
async def cancel_task(request: Request) -> Response:
    return wire(await grid_of(request).commands.cancel_task(_task_id(request)))


@table.add(
    "POST",
    "/tasks/{task_id}/start",
    summary="Start a task now (409 if dependencies are not done); an unknown id is asked"
    " of the task sources (beads) once before the 404",
    response=Task,
)
async def start_task(request: Request) -> Response:
    return wire(await grid_of(request).commands.start_any_task(_task_id(request)))


@table.add(
    "POST",
    "/tasks/{task_id}/stop",
    summary="Stop a task's agent; the task returns to ready",
    response=Task,
)
async def stop_task(request: Request) -> Response:
    return wire(await grid_of(request).commands.stop_task(_task_id(request)))


@table.add(
    "POST",
    "/tasks/{task_id}/approve",
    summary="Approve a task in review: it is queued for the merge into the feature branch"
    " (merging), done once merged; done at once when the session has no feature branch."
    " Uncommitted changes in its worktree are committed as review edits, or refused with"
    " 409 worktree_dirty ([merge] review_edits)",
    body=Approve,
    response=Task,
)
async def approve_task(request: Request) -> Response:
    req = await read_body(request, Approve)
    grid = grid_of(request)
    return wire(
        await grid.commands.approve_task(_task_id(request), accept_markers=req.accept_markers)
    )


@table.add(
    "POST",
    "/tasks/{task_id}/reject",
    summary="Send a task in review back to its agent with feedback (409 unless in review)",
    body=Reject,
    response=Task,
)
async def reject_task(request: Request) -> Response:
    req = await read_body(request, Reject)
    return wire(await grid_of(request).commands.reject_task(_task_id(request), req.feedback))


@table.add(
    "GET",
    "/tasks/{task_id}/diff",
    summary="The task's change against the commit its branch started from (409 if no branch)",
    response=TaskDiff,
)
async def task_diff(request: Request) -> Response:
    grid = grid_of(request)
    task = grid.commands.task(_task_id(request))
    return wire(await diff.task_diff(grid.workspace.root, task))


class Conflicts(WireModel):
    conflicts: list[ConflictItem]


@table.add(
    "GET",
    "/conflicts",
    summary="The conflict radar: live tasks changing the same files (with each other, or with"
    " what landed on the feature branch since they branched), and predicted conflicts",
    response=Conflicts,
)
async def conflicts(request: Request) -> Response:
    return wire(Conflicts(conflicts=list(grid_of(request).radar.items.values())))


# -- plans ------------------------------------------------------------------------------------------


async def _plan_body(request: Request) -> PlanSpec:
    data = await read_document(request, yaml_allowed=True)
    if data is None:
        raise BadRequest('request body required: {"tasks": [...]}', code="empty_body")
    return await validate_plan(normalise_plan(data))


@table.add(
    "POST",
    "/plans",
    summary="Load many tasks with dependencies at once, atomically (JSON or YAML)",
    body=PlanSpec,
    body_types=("application/json", "application/yaml"),
    response=Waves,
    status=201,
)
async def apply_plan(request: Request) -> Response:
    plan = await _plan_body(request)
    grid = grid_of(request)
    created = await grid.commands.create_tasks_yielding(plan.tasks)
    ids = {t.id for t in created}
    waves = [[i for i in wave if i in ids] for wave in grid.commands.waves()]
    body = Waves(waves=[w for w in waves if w], statuses={t.id: t.status.value for t in created})
    return answered_big(wire(body, status=201), len(created))


@table.add("GET", "/plan", summary="Waves (topological levels) of all tasks", response=Waves)
async def show_plan(request: Request) -> Response:
    grid = grid_of(request)
    statuses = {t.id: t.status.value for t in grid.state.tasks.values()}
    return wire(Waves(waves=grid.commands.waves(), statuses=statuses))


# -- session ------------------------------------------------------------------------------------------


@table.add(
    "POST",
    "/session/start",
    summary="Start a session: the feature branch is created (or continued), then ready"
    " tasks get agents (409 if it is checked out in a worktree, 422 if not a branch name)",
    body=SessionStart,
    response=SessionState,
)
async def start_session(request: Request) -> Response:
    req = await read_body(request, SessionStart)
    return wire(await grid_of(request).commands.begin_session(req))


@table.add(
    "POST",
    "/session/stop",
    summary="Stop the session (?force=1 kills agents at once)",
    response=SessionState,
    query={"force": "1 to SIGKILL at once"},
)
async def stop_session(request: Request) -> Response:
    return wire(grid_of(request).commands.stop_session(force=query_flag(request, "force")))


@table.add(
    "POST",
    "/session/finish",
    summary="Stop the session (gracefully) and report what its feature branch holds against"
    " its base; nothing is merged into the base or pushed (409 no_feature_branch)",
    response=FeatureReport,
)
async def finish_session(request: Request) -> Response:
    grid = grid_of(request)
    grid.commands.stop_session(force=False)
    tasks = list(grid.state.tasks.values())
    return wire(await report.feature_report(grid.workspace.root, grid.state.session, tasks))


class StepAction(WireModel):
    action: str  # start | stop | set_status | stop_session
    task_id: str | None = None
    agent_id: str | None = None
    profile: str | None = None
    status: str | None = None
    reason: str | None = None
    force: bool | None = None


class StepReport(WireModel):
    actions: list[StepAction]
    passes: int


@table.add(
    "POST",
    "/scheduler/step",
    summary="Reconcile once, now, and return what the scheduler did (its starts have run by"
    " the answer); with [scheduler] step_mode the loop waits for these",
    response=StepReport,
)
async def scheduler_step(request: Request) -> Response:
    scheduler = grid_of(request).scheduler
    actions = [StepAction.model_validate(describe(a)) for a in await scheduler.step()]
    report = StepReport(actions=actions, passes=scheduler.passes)
    # Each kind of action has its own fields: the others are left out, not null.
    return Response(
        report.model_dump_json(by_alias=True, exclude_none=True), media_type="application/json"
    )


# -- agents -----------------------------------------------------------------------------------------


@table.add(
    "GET",
    "/agents",
    summary="Running agents (?all=1 includes exited ones; ?limit&after pages)",
    response=Agent,
    response_list=True,
    query={"all": "1 to include exited agents", **PAGE_QUERY},
)
async def list_agents(request: Request) -> Response:
    state = grid_of(request).state
    agents = list(state.agents.values()) if query_flag(request, "all") else state.live_agents()
    if paged(request):
        return page_of(request, agents, key=_id_of)
    return wire(agents)  # type: ignore[arg-type]


@table.add("GET", "/agents/{agent_id}", summary="One agent", response=Agent)
async def get_agent(request: Request) -> Response:
    return wire(grid_of(request).commands.agent(_agent_id(request)))


@table.add(
    "POST",
    "/agents/{agent_id}/kill",
    summary="Kill an agent (SIGKILL to its group); its task is blocked",
    response=Agent,
)
async def kill_agent(request: Request) -> Response:
    return wire(grid_of(request).commands.kill_agent(_agent_id(request)))


@table.add(
    "POST",
    "/agents/{agent_id}/respond",
    summary="Send a response line to the agent's stdin",
    body=Respond,
)
async def respond(request: Request) -> Response:
    req = await read_body(request, Respond)
    answered = grid_of(request).commands.respond(_agent_id(request), req.response)
    body: dict[str, Any] = {"status": "delivered"}
    if answered is not None:
        body["question"] = answered.wire()
    return JSONResponse(body)


@table.add(
    "GET",
    "/agents/{agent_id}/output",
    summary="Output chunks after ?since=<seq>",
    response=AgentOutput,
    query={"since": "last seq already seen", "limit": "max chunks (default 1000)"},
)
async def agent_output(request: Request) -> Response:
    since = query_int(request, "since") or 0
    limit = query_int(request, "limit", minimum=1) or 1000
    body = grid_of(request).commands.output(_agent_id(request), since, min(limit, 10_000))
    return JSONResponse(body)


# -- questions ---------------------------------------------------------------------------------------


# -- questions ---------------------------------------------------------------------------------------


@table.add(
    "GET",
    "/questions",
    summary="Pending questions from agents (?all=1 includes answered and closed ones)",
    response=Question,
    response_list=True,
    query={"all": "1 to include answered and closed questions", **PAGE_QUERY},
)
async def list_questions(request: Request) -> Response:
    book = grid_of(request).questions
    items = list(book.questions.values()) if query_flag(request, "all") else book.pending()
    if paged(request):
        return page_of(request, items, key=_id_of)
    return wire(items)  # type: ignore[arg-type]


@table.add("GET", "/questions/{question_id}", summary="One question", response=Question)
async def get_question(request: Request) -> Response:
    return wire(grid_of(request).commands.question(str(request.path_params["question_id"])))


@table.add(
    "POST",
    "/questions/{question_id}/answer",
    summary="Answer a question (409 if gone or answered, 422 if not an offered option)",
    body=Respond,
    response=Question,
)
async def answer_question(request: Request) -> Response:
    req = await read_body(request, Respond)
    question_id = str(request.path_params["question_id"])
    return wire(grid_of(request).commands.answer(question_id, req.response))
