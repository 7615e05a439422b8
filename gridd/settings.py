"""Settings: ``.grid/config.toml`` parsed once, validated, and passed down explicitly.

Every field has a default and is documented in docs/configuration.md. Config keys are
snake_case; unknown keys are rejected so a typo never silently does nothing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gridd import event_types
from gridd.errors import ConfigError
from gridd.spelling import did_you_mean


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


class DaemonSettings(_Section):
    """How the daemon process itself behaves."""

    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    log_max_bytes: int = Field(
        default=10 * 1024 * 1024, ge=4096, description="Rotate gridd.log at this size"
    )
    log_backups: int = Field(default=3, ge=0, le=100, description="Rotated log files to keep")
    shutdown_timeout_seconds: float = Field(
        default=3.0, gt=0, le=60, description="Grace for open connections at shutdown"
    )
    crash_points: list[
        Literal[
            "intent.recorded",
            "spawn.recorded",
            "spawn.private_repo",
            "spawn.started",
            "finish.reclaimed",
        ]
    ] = Field(
        default_factory=list,
        description="Testing only: kill the daemon (SIGKILL) when it reaches these steps",
    )
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, le=300, description="A request's headers must arrive within this"
    )
    landlock_abi: int | None = Field(
        default=None,
        ge=0,
        description="Testing only: act as if the kernel offered at most this Landlock ABI"
        " (0: none); None: what the kernel offers",
    )
    max_connections: int = Field(
        default=1000,
        ge=4,
        le=100_000,
        description="Open connections served fully; beyond, only /health, /version, /shutdown",
    )


class EventSettings(_Section):
    """The durable event log and the SSE stream."""

    retain: int = Field(
        default=200_000, ge=100, description="Events kept in the log; older are pruned"
    )
    subscriber_queue: int = Field(
        default=4096, ge=16, description="Events buffered per SSE client before it is dropped"
    )
    subscriber_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes of events buffered per SSE client before it is dropped",
    )
    total_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes of events buffered for all SSE clients together (an event counted"
        " once); past it the client furthest behind is taken off live delivery",
    )
    stall_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Past total_bytes, a client that took no event for this long is"
        " disconnected; a slower one that still reads continues from the log",
    )
    send_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A client that cannot take one event in this time is dropped",
    )
    keepalive_seconds: float = Field(
        default=15.0, ge=0.1, le=15, description="SSE comment (keep-alive) interval"
    )
    snapshot_seconds: float = Field(
        default=30.0, ge=0.1, description="state.snapshot interval per stream"
    )


class SupervisorSettings(_Section):
    """How crashed background parts (scheduler, monitors, notifier, ...) are restarted."""

    backoff_seconds: float = Field(
        default=0.5, gt=0, le=60, description="Wait before the first restart of a crashed part"
    )
    backoff_max_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="Longest wait between restarts (it doubles)"
    )
    flap_max: int = Field(
        default=5, ge=1, le=1000, description="Crashes within flap_window_seconds that mark it down"
    )
    flap_window_seconds: float = Field(
        default=60.0, gt=0, description="The window in which crashes are counted"
    )
    down_retry_seconds: float = Field(
        default=60.0, gt=0, le=86400, description="A part marked down is tried again after this"
    )


class SchedulerSettings(_Section):
    """The reconcile loop and its defaults for sessions and tasks."""

    tick_seconds: float = Field(default=1.0, gt=0, le=60, description="Pass at least this often")
    step_mode: bool = Field(
        default=False,
        description="The loop does not run by itself: only POST /scheduler/step reconciles",
    )
    default_agent: str = Field(default="example", description="Profile for tasks that name none")
    max_agents: int = Field(default=3, ge=1, le=256, description="Default maxAgents of a session")
    max_attempts: int = Field(default=3, ge=1, le=100, description="Default maxAttempts of a task")
    backoff_seconds: float = Field(
        default=2.0, ge=0, description="First retry delay after a failure"
    )
    backoff_max_seconds: float = Field(default=300.0, ge=0, description="Retry delay ceiling")
    stop_grace_seconds: float = Field(default=10.0, ge=0, description="SIGTERM to SIGKILL on stop")
    spawn_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="An agent not started by then: its run is fenced (never starts) and the"
        " attempt fails; unless its shim already took the run, then it is waited for",
    )
    orphan_grace_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A shim whose workspace's .grid/ is deleted or replaced stops its agent"
        " this long after, and exits",
    )
    launch_grace_seconds: float | None = Field(
        default=120.0, gt=0, description="No output or heartbeat by then: launch_failed"
    )
    stall_seconds: float | None = Field(
        default=600.0, gt=0, description="Silence this long: agent.stalled (recoverable)"
    )
    stall_kill_seconds: float | None = Field(
        default=3600.0, gt=0, description="Silence this long: kill and retry"
    )
    flap_failures: int = Field(
        default=5, ge=1, description="This many failures within flap_window_seconds: failed"
    )
    flap_window_seconds: float = Field(default=600.0, gt=0, description="The flapping window")
    max_sessions: int = Field(
        default=5, ge=1, le=1000, description="Default agent sessions per task (continuations)"
    )
    budget_usd: float = Field(
        default=50.0, ge=0, description="Default session budget; a session may ask for null"
    )
    rate_limit_backoff_seconds: float = Field(
        default=900.0, gt=0, description="Park a rate-limited task this long when no reset time"
    )
    stop_when_idle: bool = Field(
        default=True,
        description="Stop a session (reason no_work) once no task can run; off with beads",
    )
    auto_resume: bool = Field(
        default=True, description="Resume rate-limited tasks by themselves when the limit resets"
    )
    prepare_ahead: int = Field(
        default=4,
        ge=0,
        le=64,
        description="Worktrees made ahead for the next tasks while slots are busy (at most"
        " the session's maxAgents; 0: off)",
    )


#: Read by no agent in a sandbox, whatever the profile lists besides (``hidden``).
DEFAULT_HIDDEN = (
    "~/.ssh",
    "~/.aws",
    "~/.gnupg",
    "~/.config/gh",
    "~/.netrc",
    "~/.git-credentials",
    "~/.docker",
    "~/.kube",
    "~/.config/gcloud",
    "~/.azure",
    "~/.password-store",
)


#: One ``allow_hosts`` entry: a host name (``*.`` for its subdomains), an IPv4 address or a
#: bracketed IPv6 one, and an optional port.
HOST_RULE = re.compile(
    r"(?:\*\.)?[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?"
)


class SandboxSettings(_Section):
    """``[agents.<name>.sandbox]``: what the kernel lets a run of this profile touch
    (``runs/sandbox.py``; enforced with Landlock by the shim)."""

    mode: Literal["off", "read-only", "workspace"] = Field(
        default="off",
        description="workspace: write only the worktree, a private TMPDIR and `writable`;"
        " read-only: the same without the worktree; off: no sandbox",
    )
    writable: list[str] | None = Field(
        default=None,
        description="More paths the agent may write (~ is the home directory); None: its"
        " adapter's own (claude: ~/.claude and ~/.claude.json)",
    )
    hidden: list[str] = Field(
        default_factory=lambda: list(DEFAULT_HIDDEN),
        description="Paths the agent may not read (the workspace's .grid/ always is)",
    )
    network: Literal["allow", "none", "allowlist"] = Field(
        default="allow",
        description="allow: the network as the user has it; none: no TCP connect or bind;"
        " allowlist: only allow_hosts, through a filtering proxy the daemon runs",
    )
    allow_hosts: list[str] | None = Field(
        default=None,
        description="With network = allowlist: host or host:port (a host alone: ports 443"
        " and 80; *.example.com: its subdomains); None: the adapter's own (claude:"
        " api.anthropic.com)",
    )

    @field_validator("allow_hosts")
    @classmethod
    def _host_spellings(cls, hosts: list[str] | None) -> list[str] | None:
        """A host the proxy could never match would refuse it, and nothing would say why."""
        wrong = [h for h in hosts or () if not HOST_RULE.fullmatch(h)]
        if wrong:
            raise PydanticCustomError(
                "bad_host",
                "not a host or host:port: {wrong} (e.g. 'api.anthropic.com',"
                " '*.pypi.org', '127.0.0.1:8080', '[::1]:8080')",
                {"wrong": ", ".join(repr(w) for w in wrong)},
            )
        return hosts

    @model_validator(mode="after")
    def _network_needs_a_sandbox(self) -> SandboxSettings:
        """The network rules are part of the Landlock ruleset: no sandbox, no rules."""
        if self.network != "allow" and self.mode == "off":
            raise PydanticCustomError(
                "network_without_sandbox",
                "network = '{network}' needs a sandbox: set mode = 'workspace' or"
                " 'read-only' (mode 'off' leaves the network alone)",
                {"network": self.network},
            )
        return self


class KubernetesProfile(_Section):
    """``[agents.<name>.kubernetes]``: where this profile's Jobs differ from
    ``[executors.kubernetes]`` (unset: as there)."""

    image: str | None = Field(default=None, description="the box image of this profile's runs")
    cpu: str | None = Field(default=None, description="CPU request and limit")
    memory: str | None = Field(default=None, description="memory request and limit")
    service_account: str | None = Field(default=None, description="the pods' service account")
    runtime_class: str | None = Field(default=None, description="runtimeClassName")
    deadline_seconds: int | None = Field(default=None, ge=60, description="activeDeadlineSeconds")
    secret_env: dict[str, str] | None = Field(
        default=None, description="environment from Secrets (replaces the executor's)"
    )


class AgentProfile(_Section):
    """``[agents.<name>]``: how to run one kind of agent."""

    command: list[str] = Field(min_length=1, description="argv; {prompt} {task_id} {worktree}")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment")
    concurrency: int | None = Field(default=None, ge=1, description="at most this many at once")
    timeout_seconds: float | None = Field(
        default=None, gt=0, description="kill an agent running longer"
    )
    adapter: str = Field(default="heartbeat", description="how gridd reads the agent's output")
    adapter_options: dict[str, Any] = Field(
        default_factory=dict, description="adapter settings, e.g. a pattern pack's auto answers"
    )
    cost_per_session: float | None = Field(
        default=None, ge=0, description="estimated USD per session when the agent reports none"
    )
    launch_grace_seconds: float | None = Field(
        default=None, gt=0, description="overrides [scheduler] launch_grace_seconds"
    )
    stall_seconds: float | None = Field(default=None, gt=0, description="overrides the stall time")
    stdin: Literal["pipe", "null"] = Field(
        default="pipe", description="answers go to stdin when 'pipe'"
    )
    sandbox: SandboxSettings = Field(
        default_factory=SandboxSettings.model_construct,
        description="the kernel-enforced sandbox of its runs (mode off by default)",
    )
    executor: Literal["local", "podman", "kubernetes"] | None = Field(
        default=None, description="where its runs execute; unset: [executors] default"
    )
    kubernetes: KubernetesProfile = Field(
        default_factory=KubernetesProfile.model_construct,
        description="its Jobs' image and resources, where they differ from [executors.kubernetes]",
    )

    def box_options(self, executor: str) -> dict[str, Any]:
        """What this profile changes of its executor's boxes (``Launch.box``)."""
        if executor == "kubernetes":
            return self.kubernetes.model_dump(exclude_none=True)
        return {}


#: How gridd runs Claude Code headless: stream-json both ways (stdin stays open for follow-ups
#: and answers). Without the permission prompt tool, which ``CLAUDE_PERMISSION_ARGS`` adds.
CLAUDE_STREAM_ARGS = (
    "-p",
    "--output-format",
    "stream-json",
    "--input-format",
    "stream-json",
    "--verbose",
)
#: Permission prompts arrive as control requests on stdout, answered on stdin.
CLAUDE_PERMISSION_ARGS = ("--permission-prompt-tool", "stdio")
#: How gridd runs the Codex CLI headless: JSON events on stdout, the worktree writable by
#: codex's own sandbox (``exec`` is read-only otherwise); the prompt follows as the last
#: argument (``resume <id>`` goes before it).
CODEX_EXEC_ARGS = ("exec", "--json", "-s", "workspace-write", "--skip-git-repo-check")
#: How gridd runs the Gemini CLI headless: stream-json events on stdout, every tool allowed
#: (headless gemini cannot ask; yolo is what lets it write and run commands), the worktree
#: trusted for the session; ``-p {prompt}`` follows.
#: How gridd runs opencode headless: JSON events on stdout; ``--dir`` because opencode takes
#: its directory from ``$PWD`` (a daemon's), not from its working directory.
OPENCODE_RUN_ARGS = ("run", "--format", "json", "--dir", "{worktree}")
GEMINI_STREAM_ARGS = ("--output-format", "stream-json", "--approval-mode", "yolo", "--skip-trust")


def builtin_profiles() -> dict[str, AgentProfile]:
    """Profiles that exist without any configuration."""
    return {
        "example": AgentProfile(
            command=[sys.executable, "-m", "gridd.runs.example", "{prompt}"],
            adapter="heartbeat",
            cost_per_session=0.0,
        ),
        # The prompt goes in as the first stream-json message on stdin, which stays open
        # for answers; permission prompts arrive as control requests (--permission-prompt-tool).
        "claude": AgentProfile(
            command=["claude", *CLAUDE_STREAM_ARGS, *CLAUDE_PERMISSION_ARGS],
            adapter="claude",
            adapter_options={"permission_prompt_tool": "stdio"},
            stdin="pipe",
            cost_per_session=2.0,
        ),
        # codex exec asks nothing in non-interactive mode and waits for stdin to close
        # before it starts: /dev/null. Its sandbox is the approval policy.
        "codex": AgentProfile(
            command=["codex", *CODEX_EXEC_ARGS, "{prompt}"],
            adapter="codex",
            stdin="null",
            cost_per_session=2.0,
        ),
        "gemini": AgentProfile(
            command=["gemini", *GEMINI_STREAM_ARGS, "-p", "{prompt}"],
            adapter="gemini",
            stdin="null",
            cost_per_session=2.0,
        ),
        "opencode": AgentProfile(
            command=["opencode", *OPENCODE_RUN_ARGS, "{prompt}"],
            adapter="opencode",
            stdin="null",
            cost_per_session=2.0,
        ),
    }


class WatchSettings(_Section):
    """How agent monitors learn that an agent wrote something (``runs/wakeups.py``)."""

    notify: bool = Field(
        default=True, description="File notifications (inotify) wake monitors; false = poll"
    )
    sweep_seconds: float = Field(
        default=2.0,
        ge=0.05,
        le=60,
        description="Safety-net sweep for missed notifications (with notifications on)",
    )
    fallback_seconds: float = Field(
        default=0.05,
        ge=0.005,
        le=60,
        description="Poll interval where notifications are off or unavailable (macOS)",
    )
    coalesce_seconds: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="Notifications are read at most this often: a lone write at once, many"
        " agents' writes in one batch (one transaction) per window; 0: always at once",
    )


class BeadsSettings(_Section):
    """The beads (``bd``) task source."""

    enabled: bool | None = Field(
        default=None, description="None: on when .beads/ exists and bd is found"
    )
    command: list[str] = Field(default_factory=lambda: ["bd"], description="argv to run bd")
    poll_seconds: float = Field(
        default=10.0,
        ge=0,
        description="How often to run 'bd ready' besides the watch (the safety net); 0: never",
    )
    watch: bool = Field(default=True, description="Run 'bd ready' when files under .beads/ change")
    default_agent: str | None = Field(default=None, description="Profile for beads tasks")
    review_label: str = Field(
        default="gridd:review",
        pattern=r"^[^,\s]{1,100}$",  # bd splits --add-label values on commas
        description="Label that shows a bead in review (status stays in_progress)",
    )
    review_status: str | None = Field(
        default=None,
        pattern=r"^[a-z][a-z0-9_-]*$",
        description="A custom bd status for review, only if configured in bd (status.custom)",
    )
    failed_label: str = Field(
        default="gridd:failed",
        pattern=r"^[^,\s]{1,100}$",
        description="Label on a bead reopened after its task failed",
    )
    claim_ahead: int = Field(
        default=4,
        ge=0,
        le=64,
        description="Ready beads claimed before a slot is free for them, while the session"
        " runs (0: a bead is claimed only when its task starts)",
    )
    write_attempts: int = Field(
        default=6, ge=1, le=20, description="Tries of one bd write before giving up"
    )
    retry_seconds: float = Field(
        default=0.5, gt=0, le=60, description="First pause before retrying a bd write (doubles)"
    )
    first_sync_seconds: float = Field(
        default=3.0,
        ge=0,
        le=60,
        description="At start, how long the daemon waits for the first 'bd ready' before it"
        " serves anyway (then /health says beads is degraded until a read lands)",
    )


class NotificationSettings(_Section):
    """``[notifications]``: which events reach a human, and through which channels."""

    events: list[str] = Field(
        default_factory=lambda: [
            "agent.question",
            "task.failed",
            "session.stopped",
            "tasks.all_done",
            "agent.stalled",
        ],
        description="Event types (or derived task.failed, tasks.all_done) that notify",
    )

    @field_validator("events")
    @classmethod
    def _known_events(cls, events: list[str]) -> list[str]:
        """A misspelt type would never notify, and nothing would say so."""
        wrong = event_types.unknown(events, event_types.NOTIFIABLE)
        if not wrong:
            return events
        typos = [name for name in wrong if name not in event_types.ALL]
        mute = [name for name in wrong if name in event_types.ALL]
        problems = []
        if typos:
            problems.append(
                event_types.unknown_message(typos, event_types.NOTIFIABLE, what="event")
            )
        if mute:
            problems.append(
                ", ".join(f"'{name}'" for name in mute)
                + (" never notifies" if len(mute) == 1 else " never notify")
                + " (notify.* would notify of itself; state.snapshot and reset are per stream)"
            )
        raise PydanticCustomError("unknown_event", "; ".join(problems))

    webhook_url: str | None = Field(
        default=None, pattern=r"^https?://", description="POST each notification here as JSON"
    )
    webhook_headers: dict[str, str] = Field(
        default_factory=dict, description="Extra HTTP headers for the webhook"
    )
    desktop: bool = Field(default=True, description="notify-send (Linux) or osascript (macOS)")
    command: list[str] = Field(
        default_factory=list, description="argv run per notification, JSON on stdin; [] = off"
    )
    coalesce_seconds: float = Field(
        default=30.0, ge=0, description="Identical notifications within this window merge"
    )
    timeout_seconds: float = Field(
        default=10.0, gt=0, le=300, description="Per attempt: webhook request, command, desktop"
    )
    attempts: int = Field(default=3, ge=1, le=10, description="Webhook tries before giving up")
    queue_size: int = Field(
        default=1000, ge=1, description="Pending notifications kept; the oldest are dropped"
    )


class MergeSettings(_Section):
    """``[merge]``: how approved tasks are merged into the session's feature branch."""

    strategy: Literal["merge", "squash", "rebase"] = Field(
        default="merge",
        description="merge: a --no-ff merge commit naming the task; squash: one commit;"
        " rebase: the task's commits replayed on the feature branch, then fast-forward",
    )
    check: list[str] = Field(
        default_factory=list,
        description="argv run in the integration worktree on the merged result; non-zero"
        " exit refuses the merge ([] = no check)",
    )
    check_timeout_seconds: float = Field(
        default=600.0, gt=0, le=24 * 3600, description="The check is killed after this long"
    )
    git_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        le=24 * 3600,
        description="Each git call of the merge queue is stopped after this long (with what it"
        " started: a filter or hook driver) and the merge fails with the reason",
    )
    max_batch: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="The merge train, with a check: up to this many approved tasks merged in"
        " order into one candidate and gated once (a failing candidate is bisected); 1 = one"
        " task at a time",
    )
    gate_concurrency: int = Field(
        default=1,
        ge=1,
        le=64,
        description="The merge train, with a check: up to this many candidates gated at once,"
        " each built on the one ahead in its own integration worktree (speculation); each is"
        " a run of the check on this machine",
    )
    batch_wait_seconds: float = Field(
        default=0.5,
        ge=0,
        le=60,
        description="With a train (max_batch or gate_concurrency > 1), approvals arriving"
        " within this long of the oldest waiting one ride together",
    )
    on_conflict: Literal["agent", "human", "fail"] = Field(
        default="agent",
        description="Default session policy for a conflicting or failing merge: agent (rerun"
        " the task's agent on the conflict), human (back to review, a question asked), fail",
    )
    allow_markers: list[str] = Field(
        default_factory=list,
        description="Globs of paths that may hold conflict-marker-like lines (test fixtures,"
        " docs about git): not refused by the finisher nor the merge queue",
    )
    review_edits: Literal["commit", "refuse"] = Field(
        default="commit",
        description="Uncommitted changes in a task's worktree at approve: commit (a review"
        " commit by the daemon's git user, merged with the rest) or refuse (409 worktree_dirty)",
    )
    remove_worktree: bool = Field(
        default=True, description="Remove a merged task's worktree (only if clean and merged)"
    )
    delete_branch: bool = Field(
        default=False,
        description="Delete a merged task's branch (only when the feature branch contains it)",
    )
    hold_overlapping: bool = Field(
        default=False,
        description="Hold back a ready task whose declared files overlap a live task's",
    )
    radar_seconds: float = Field(
        default=3.0, gt=0, le=3600, description="Conflict radar refresh period per live task"
    )
    radar_looks_per_second: float = Field(
        default=2.0,
        gt=0,
        le=1000,
        description="At most this many worktrees re-read per second, however many agents print",
    )


class PodmanSettings(_Section):
    """The podman executor: each run in a container of its own (docs/executors.md)."""

    command: list[str] = Field(default_factory=lambda: ["podman"], description="argv of podman")
    image: str = Field(
        default="",
        description="the box image; empty: built from Debian packages with mmdebstrap, cached",
    )
    suite: str = Field(default="bookworm", description="Debian suite of the built image")
    packages: list[str] = Field(
        default_factory=lambda: ["git", "python3"],
        description="packages of the built image (git and Python run the in-box shim)",
    )
    runtime: str | None = Field(default="runc", description="--runtime; unset: podman's own")
    ulimits: list[str] = Field(
        default_factory=lambda: ["nofile=1024:1024", "nproc=1024:1024"],
        description="--ulimit values (a VM whose limits runc may not raise needs them lowered)",
    )
    network: str = Field(default="none", description="--network: 'none' keeps the box offline")
    mounts: list[str] = Field(
        default_factory=list, description="--volume values (host:box[:ro]); none by default"
    )
    memory: str | None = Field(default=None, description="--memory limit, e.g. '2g'")
    env: list[str] = Field(
        default_factory=list,
        description="names of the daemon's own environment passed to the box (GRID_* and the"
        " profile's env always are)",
    )
    look_seconds: float = Field(
        default=0.25, gt=0, le=10, description="how often the mirror looks at each box"
    )


class KubernetesSettings(_Section):
    """The kubernetes executor: each run in a ``batch/v1`` Job of its own (docs/executors.md)."""

    kubeconfig: str = Field(
        default="",
        description="kubeconfig file; empty: $KUBECONFIG, ~/.kube/config, or the in-cluster account",
    )
    context: str = Field(default="", description="kubeconfig context; empty: its current one")
    server: str = Field(
        default="", description="API server URL used as is, no credentials (kubectl proxy, tests)"
    )
    namespace: str = Field(default="default", description="where the Jobs go")
    image: str = Field(
        default="", description="the box image (contrib/kubernetes/Dockerfile); required"
    )
    service_account: str = Field(
        default="", description="the pods' service account; empty: the namespace's default"
    )
    runtime_class: str = Field(
        default="", description="runtimeClassName (gVisor, Kata); empty: none"
    )
    cpu: str = Field(default="1", description="CPU request and limit of each run, e.g. '500m'")
    memory: str = Field(default="2Gi", description="memory request and limit of each run")
    deadline_seconds: int = Field(
        default=4 * 3600,
        ge=60,
        description="activeDeadlineSeconds: the cluster kills a run past it",
    )
    ttl_seconds: int = Field(
        default=3600,
        ge=0,
        description="ttlSecondsAfterFinished: a finished Job is removed after it",
    )
    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="environment from Secrets, by reference: NAME = 'secret/key'",
    )
    env: list[str] = Field(
        default_factory=list,
        description="names of the daemon's own environment passed to the box (GRID_* and the"
        " profile's env always are)",
    )
    start_timeout_seconds: float = Field(
        default=300, gt=0, description="a pod not running within this is given up on"
    )
    look_seconds: float = Field(
        default=0.5, gt=0, le=10, description="how often the mirror looks at each box (one exec)"
    )


class ExecutorSettings(_Section):
    """Where runs execute: on this machine or in a box (docs/executors.md)."""

    default: Literal["local", "podman", "kubernetes"] = Field(
        default="local", description="for profiles that set no executor"
    )
    podman: PodmanSettings = Field(default_factory=PodmanSettings.model_construct)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings.model_construct)


class Settings(_Section):
    """All of gridd's settings, grouped by the part of the daemon they steer.

    A section left out of ``config.toml`` holds its defaults, made without validation (they
    are valid by definition; a test holds them to it): pydantic builds a section's validator
    only when a config file sets something in it. Building all nine at every start was
    ~8 ms of it and ~0.5 MB of every idle daemon (docs/performance.md).
    """

    daemon: DaemonSettings = Field(default_factory=DaemonSettings.model_construct)
    events: EventSettings = Field(default_factory=EventSettings.model_construct)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings.model_construct)
    agents: dict[str, AgentProfile] = Field(default_factory=dict)
    beads: BeadsSettings = Field(default_factory=BeadsSettings.model_construct)
    watch: WatchSettings = Field(default_factory=WatchSettings.model_construct)
    notifications: NotificationSettings = Field(
        default_factory=NotificationSettings.model_construct
    )
    merge: MergeSettings = Field(default_factory=MergeSettings.model_construct)
    supervisor: SupervisorSettings = Field(default_factory=SupervisorSettings.model_construct)
    executors: ExecutorSettings = Field(default_factory=ExecutorSettings.model_construct)

    @field_validator("agents", mode="before")
    @classmethod
    def _on_builtins(cls, agents: Any) -> Any:
        return on_builtins(agents)

    def profiles(self) -> dict[str, AgentProfile]:
        """Built-in profiles overlaid with the configured ones."""
        return {**builtin_profiles(), **self.agents}


def on_builtins(agents: Any) -> Any:
    """``[agents.<name>]`` tables as written, each one that names a built-in profile and no
    ``command`` of its own completed from that profile: ``[agents.claude.sandbox]`` alone
    turns on the sandbox of the built-in ``claude`` (what ``gridctl init`` writes); a key it
    sets replaces the built-in's whole. One that names its command is a profile of its own,
    as before (without a command it was refused)."""
    if not isinstance(agents, dict):
        return agents
    builtins = builtin_profiles()
    return {
        name: (
            builtins[name].model_dump(exclude_defaults=True) | profile
            if name in builtins and isinstance(profile, dict) and "command" not in profile
            else profile
        )
        for name, profile in agents.items()
    }


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _unknown_key(loc: tuple[Any, ...]) -> str:
    """The problem with a key no section has: the closest known key at its place, or the
    keys known there."""
    where: Any = Settings
    for part in loc[:-1]:  # down to the model the key was found in
        if isinstance(where, type) and issubclass(where, BaseModel):
            field = where.model_fields.get(str(part))
            where = field.annotation if field else None
        else:  # the table of profiles: [agents.<name>]
            where = get_args(where)[1] if get_origin(where) is dict else None
    if not (isinstance(where, type) and issubclass(where, BaseModel)):
        return "unknown key"
    known = list(where.model_fields)
    if hint := did_you_mean(str(loc[-1]), known):
        return f"unknown key{hint}"
    return f"unknown key (known: {', '.join(known)})"


def _problem(loc: tuple[Any, ...], err_type: str, msg: str) -> dict[str, str]:
    unknown = err_type == "extra_forbidden"
    return {"key": _format_loc(loc), "problem": _unknown_key(loc) if unknown else msg}


def _validate_section(key: str, value: Any) -> Any:
    section = Settings.model_fields[key].annotation
    if isinstance(section, type) and issubclass(section, BaseModel):
        return section.model_validate(value)
    # the one table: agents
    return TypeAdapter(dict[str, AgentProfile]).validate_python(on_builtins(value))


def parse_settings(data: dict[str, Any], *, source: str = "config") -> Settings:
    """Validate a parsed config mapping; errors name the key and the problem.

    Each section present is validated on its own (see ``Settings``), in the order the
    sections are declared; every problem of every section is reported, unknown top-level
    keys last, as one validation of the whole would."""
    sections: dict[str, Any] = {}
    problems: list[dict[str, str]] = []
    for key in Settings.model_fields:
        if key not in data:
            continue
        try:
            sections[key] = _validate_section(key, data[key])
        except ValidationError as exc:
            problems += [
                _problem((key, *err["loc"]), err["type"], err["msg"]) for err in exc.errors()
            ]
    problems += [
        _problem((key,), "extra_forbidden", "") for key in data if key not in Settings.model_fields
    ]
    if problems:
        first = problems[0]
        key, problem = first["key"], first["problem"]
        unknown = problem.removeprefix("unknown key")
        raise ConfigError(
            f"{source}: unknown key '{key}'{unknown}"
            if unknown != problem
            else f"{source}: invalid value for '{key}': {problem}",
            details={"source": source, "problems": problems},
        )
    settings = Settings.model_construct(**sections)
    default = settings.scheduler.default_agent
    if default not in settings.profiles():
        known = ", ".join(sorted(settings.profiles()))
        problem = f"names unknown agent profile {default!r} (known: {known})"
        raise ConfigError(
            f"{source}: invalid value for 'scheduler.default_agent': {problem}",
            details={
                "source": source,
                "problems": [{"key": "scheduler.default_agent", "problem": problem}],
            },
        )
    return settings


def load_settings(path: Path) -> Settings:
    """Read ``config.toml``; a missing file means all defaults."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Settings.model_construct()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    import tomllib  # here, not at the top: most workspaces have no config.toml

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", details={"source": str(path)}) from None
    return parse_settings(data, source=str(path))
