"""The domain: tasks, agents, questions, the session, events and the RepoState view.

These pydantic models are the wire format too (camelCase, as the covend proposal's
``RepoState``); the daemon, the client and ``gridctl`` share them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


def utcnow() -> datetime:
    return datetime.now(UTC)


def isotime(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


class WireModel(BaseModel):
    """camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, defer_build=True)

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class TaskStatus(StrEnum):
    PENDING = "pending"  # dependencies not done
    READY = "ready"
    WORKING = "working"
    REVIEW = "review"  # agent finished; changes on its branch
    MERGING = "merging"  # approved: queued for, or in, the merge into the feature branch
    DONE = "done"  # merged into the feature branch (or approved where no merge applies)
    FAILED = "failed"
    BLOCKED = "blocked"  # needs a human
    CANCELLED = "cancelled"
    RATE_LIMITED = "rate_limited"  # parked until the provider's usage limit resets


#: Statuses a task never leaves on its own.
TERMINAL_TASK_STATUSES = frozenset({TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED})


class Task(WireModel):
    id: str
    title: str
    prompt: str = ""
    priority: int = Field(2, ge=0, le=4)
    depends_on: list[str] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)
    agent: str | None = None
    max_attempts: int = Field(3, ge=1)
    timeout_seconds: float | None = None
    status: TaskStatus = TaskStatus.PENDING
    attempts: int = 0
    source: str = "native"
    branch: str | None = None
    base_commit: str | None = None  # where the branch started: changedFiles are against it
    worktree: str | None = None
    error: str | None = None
    changed_files: list[str] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    max_sessions: int = Field(5, ge=1)
    sessions: int = 0  # agent sessions run so far in the current continuation chain
    summary: str | None = None  # carried into the next session's prompt
    cost_usd: float = 0.0
    resume_at: datetime | None = None  # rate_limited until then
    waiting_since: datetime | None = None  # its agent waits for a human
    # Set only by gridd.lifecycle: why the task has its status, and since when.
    status_reason: str | None = None
    status_changed_at: datetime | None = None
    # Retry state, persisted so that a restart neither forgets a backoff nor a flap.
    backoff_until: datetime | None = None  # no new attempt before this (wall clock)
    failure_times: list[datetime] = Field(default_factory=list)  # recent failed runs
    files: list[str] = Field(default_factory=list)  # files it declares it will touch (radar)
    feedback: str | None = None  # a reviewer's or the merge queue's words for its next run
    merge_queued_at: datetime | None = None  # approved at: the merge queue's order
    merge_commit: str | None = None  # the feature branch commit that holds its work
    merged_into: str | None = None  # the feature branch it was merged into (set when done)
    merge_conflict: list[str] = Field(default_factory=list)  # files its last merge conflicted on
    # A run that completed before a cancel reached it: its work, kept on this branch (the
    # task's own), never merged or deleted. None otherwise (a completed run goes to review).
    kept_branch: str | None = None
    # Files git still saw a conflict in (unmerged, or marker lines) when its run ended.
    conflict_unresolved: list[str] = Field(default_factory=list)
    # Paths whose marker-like lines a reviewer accepted (approve --accept-markers).
    accepted_markers: list[str] = Field(default_factory=list)


class AgentStatus(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"
    WAITING = "waiting"  # running, but blocked on a question to a human


class Agent(WireModel):
    id: str
    task_id: str
    profile: str
    worktree_path: str
    pid: int | None = None
    status: AgentStatus = AgentStatus.STARTING
    started_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None
    exit_code: int | None = None
    last_output: str = ""
    output_seq: int = 0
    attempt: int = 1
    run_dir: str = ""
    create_time: float | None = None  # with pid, the process identity (pids are reused)
    stop_reason: str | None = None
    error: str | None = None
    shim_pid: int | None = None
    shim_create_time: float | None = None
    adapter: str = "heartbeat"
    session_number: int = 1
    session_id: str | None = None  # the agent CLI's own session (claude --resume)
    activity: str | None = None
    message: str | None = None
    last_heartbeat: datetime | None = None
    stalled: bool = False
    cost_usd: float | None = None
    result: str | None = None
    heartbeat_offset: int = 0
    #: How much of its ``denied.ndjson`` is published (``agent.sandbox_denied``).
    denied_offset: int = 0
    waiting_since: datetime | None = None
    status_reason: str | None = None  # set only by gridd.lifecycle: why this status
    # What a user (or the daemon) wants done to it: "stop" or "kill". Recorded first and
    # carried out by the reconciler, so a daemon killed in between still does it.
    intent: str | None = None
    model: str | None = None  # the model the agent runs, as it says (claude's system/init)
    current_tool: str | None = None  # the tool it uses now ("Bash: npm test")
    input_tokens: int | None = None  # tokens of this run so far, as the agent reports them
    output_tokens: int | None = None
    # Started while its task's claim (beads) was still with the source: a daemon that dies
    # before the answer asks again when it reattaches the run (``pool.spawning``).
    claim_pending: bool = False
    # When gridd first sent the running agent a signal it handles itself (a stop's SIGTERM
    # it catches): an exit after that may be the stop's doing. None: nothing of gridd's
    # could make it exit with a code of its own, so an exit 0 is its own completion, even
    # with a stop asked for meanwhile (``pool/stopping.py``, ``outcome.decide``).
    signalled_at: datetime | None = None
    # What the kernel lets the run touch (``runs/sandbox.py``): mode, writable, hidden.
    # None: no sandbox (mode off).
    sandbox: dict[str, Any] | None = None
    # Where the run executes (docs/executors.md): None on this machine; in a box, the
    # engine and the box's name, e.g. {"kind": "podman", "box": "grid-1a2b3c4d-a12"}, and
    # once it runs its ``node`` (kubernetes: the pod's spec.nodeName; podman: this host)
    # and, where the box is a Job, its ``pod``.
    executor: dict[str, str] | None = None
    # Why a run in a box ended, when its engine knows and it was not the agent's doing
    # (docs/executors.md): oom_killed, deadline_exceeded, evicted, node_lost, box_gone.
    exit_reason: str | None = None


class QuestionStatus(StrEnum):
    PENDING = "pending"
    ANSWERED = "answered"
    CLOSED = "closed"  # the agent exited (or was stopped) before an answer


class Question(WireModel):
    id: str
    agent_id: str
    task_id: str
    type: str = "clarification"
    question: str
    options: list[str] = Field(default_factory=list)
    asked_at: datetime = Field(default_factory=utcnow)
    status: QuestionStatus = QuestionStatus.PENDING
    answer: str | None = None
    answered_at: datetime | None = None
    closed_reason: str | None = None
    key: str = ""  # the adapter's id for it within the run
    meta: dict[str, Any] = Field(default_factory=dict)  # protocol details for the answer


class SessionState(WireModel):
    started: bool = False
    feature_branch: str | None = None
    base_branch: str | None = None  # what the feature branch was created from
    base_commit: str | None = None  # the base branch's commit when the session started
    on_conflict: str = "agent"  # agent | human | fail: a conflicting or failing merge
    max_agents: int = 3
    started_at: datetime | None = None
    budget_usd: float | None = None  # None only when explicitly unlimited
    spent_usd: float = 0.0  # finished runs of this session
    stop_reason: str | None = None  # user | budget_exhausted | no_work | stop_file | error
    stopped_at: datetime | None = None


class Stats(WireModel):
    pending: int = 0
    ready: int = 0
    working: int = 0
    review: int = 0
    merging: int = 0
    done: int = 0
    failed: int = 0
    blocked: int = 0
    cancelled: int = 0
    rate_limited: int = 0
    waiting: int = 0
    spent_usd: float = 0.0
    #: Done tasks per feature branch they were merged into (``Task.merged_into``).
    merged_by_branch: dict[str, int] = Field(default_factory=dict)


class DaemonInfo(WireModel):
    version: str
    api_version: int
    pid: int
    uptime: float
    workspace: str
    started_at: datetime
    last_event_id: int
    subscribers: int
    last_beads_sync: datetime | None = None
    warnings: list[str] = Field(default_factory=list)
    #: ``[merge] review_edits``: what an approve does with uncommitted changes in a task's
    #: worktree (``commit`` or ``refuse``), so an editor can say it before the approve.
    review_edits: str = "commit"


class ConflictItem(WireModel):
    """One finding of the conflict radar (``GET /conflicts``)."""

    id: str  # "tasks:a+b" or "feature:a"
    kind: str  # tasks: two live tasks change the same files; feature: a task and what landed
    tasks: list[str]
    files: list[str]  # changed by both
    predicted_conflict: bool = False  # git merge-tree says their branches conflict
    conflict_files: list[str] = Field(default_factory=list)
    feature_commit: str | None = None  # for kind feature: the feature branch's tip


class TrainCandidate(WireModel):
    """One candidate of the merge train, in its own integration worktree: ``tasks`` merged
    on ``ahead`` (the candidate ahead of it; None: on the feature branch's tip). ``phase``:
    ``gating``, ``passed``, ``failed``, ``landing``, ``landed``."""

    position: int  # 1: on the feature branch's tip
    tasks: list[str]
    candidate: str
    ahead: str | None = None
    phase: str = "gating"
    gate_started_at: datetime | None = None


class MergeTrain(WireModel):
    """The merge train's candidates under way (``[merge] max_batch`` or ``gate_concurrency``
    > 1): which tasks ride and where they are. ``phase``: ``merging`` (built in the
    integration worktrees), ``gating`` (the check runs, the first since
    ``gate_started_at``), ``landing`` (the feature branch moves). ``candidates``: each gated
    at once, built on the one ahead (``[merge] gate_concurrency``)."""

    batch_id: str
    phase: str
    tasks: list[str]  # riding, in order
    feature_commit: str | None = None  # merged onto
    candidate: str | None = None  # the last one: what the feature branch becomes
    bisecting: bool = False  # part of a failed batch, gated to find the task that fails
    retry: bool = False  # a last suspect gated alone once more
    gate_started_at: datetime | None = None
    retries: int = 0  # since the daemon started: last suspects that passed alone (flaky)
    candidates: list[TrainCandidate] = Field(default_factory=list)


class RepoState(WireModel):
    session: SessionState
    tasks: list[Task]
    agents: list[Agent]
    pending_questions: list[Question]
    stats: Stats
    daemon: DaemonInfo
    conflicts: list[ConflictItem] = Field(default_factory=list)
    merge_train: MergeTrain | None = None


class Event(WireModel):
    """One entry of the durable event log; ``id`` increases strictly.

    Its bookkeeping lives in ``__slots__``, not pydantic private attributes: every event is
    touched several times on its way to each stream, and a private attribute costs a
    Python-level ``__getattr__`` per read (2.5 us against 0.1 us), and its set-up on
    construction more than the validation itself."""

    __slots__ = ("_holders", "_json", "_nbytes", "_sse")

    id: int
    type: str
    data: dict[str, Any]
    ts: datetime

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        setattr_ = object.__setattr__
        # Encodings computed once and shared by every stream that sends this event.
        setattr_(self, "_json", None)
        setattr_(self, "_sse", None)
        setattr_(self, "_nbytes", 256)  # the encoded payload's size, for queue budgets
        setattr_(self, "_holders", 0)  # subscriber queues holding it (the bus's budget)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EVENT_SLOTS:  # bookkeeping: not a field, no pydantic machinery
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    if TYPE_CHECKING:
        _json: str | None
        _sse: bytes | None
        _nbytes: int
        _holders: int


_EVENT_SLOTS = frozenset(Event.__slots__)


class VersionInfo(WireModel):
    version: str
    api_version: int
    pid: int
    python: str
    handover: int | None = None  # gridd.HANDOVER_PROTOCOL: which shims a successor can adopt


class Health(WireModel):
    """``GET /health``: ``ok``, or ``degraded`` with the reasons (HTTP 503 when ``core``)."""

    status: str = "ok"
    pid: int
    uptime: float
    warnings: list[str] = Field(default_factory=list)
    #: What is not working: supervised parts not up, and ``store`` while it cannot write.
    degraded: list[str] = Field(default_factory=list)
    #: Every supervised background part and its state: "up", "restarting" or "down".
    parts: dict[str, str] = Field(default_factory=dict)
    #: True when a core part is not up: /health then answers 503.
    core_down: bool = False


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorBody(BaseModel):
    error: ErrorDetail
