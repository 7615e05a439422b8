"""The event types: every type gridd publishes, in one list.

``GET /events?types=``, ``gridctl events --types`` and ``[notifications] events`` check the
names they are given against it, so a misspelt type is refused with a suggestion instead of
silently matching nothing. docs/events.md describes each; tests/test_event_types.py proves
that this list, the types the source publishes and that table are the same.

It imports nothing at load: the CLI, the settings and the API all read it.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Appended to the durable log and fanned out by the bus (``gridd.events``).
LOGGED: frozenset[str] = frozenset(
    {
        # the daemon
        "daemon.started",
        "daemon.stopping",
        "daemon.degraded",
        "daemon.recovered",
        "daemon.store_quarantined",
        "daemon.store_problem",
        "lifecycle.illegal_transition",
        "worktree.orphaned",
        "worktree.missing",
        # sessions and tasks
        "session.started",
        "session.unbudgeted",
        "session.stopped",
        "session.stop_file_cleared",
        "tasks.changed",
        "task.start_failed",
        "task.rate_limited",
        # the merge queue and the review loop
        "session.branch_created",
        "task.merge_queued",
        "task.merged",
        "task.merge_conflict",
        "task.merge_check_failed",
        "task.merge_returned",
        "task.merge_retry",
        "task.merge_waiting",
        "task.merge_abandoned",
        "task.merge_failed",
        # the merge train: a candidate of several tasks, gated once, bisected when it fails
        "merge.batch_started",
        "merge.batch_passed",
        "merge.batch_failed",
        "merge.batch_discarded",
        "merge.bisected",
        "task.merge_refused",
        "task.conflict_unresolved",
        "task.review_edits",
        "task.torn_down",
        "task.rejected",
        "conflict.detected",
        "conflict.cleared",
        # agents and their questions
        "agent.spawned",
        "agent.output",
        "agent.question",
        "agent.completed",
        "agent.failed",
        "agent.continued",
        "agent.stopped",
        "agent.reattached",
        "agent.spawn_interrupted",
        "agent.responded",
        "agent.auto_answered",
        "agent.stalled",
        "agent.recovered",
        "agent.launch_failed",
        "agent.rate_limited",
        "agent.nudged",
        "agent.retrying",
        "agent.warning",
        "agent.finish_failed",
        "agent.sandbox_denied",
        "question.answered",
        "question.closed",
        # sources and notifications
        "beads.warning",
        "beads.error",
        "beads.claim_lost",
        "notify.failed",
        "notify.skipped",
    }
)

#: Made for one stream (``gridd.api.sse``), never stored in the log.
SNAPSHOT = "state.snapshot"
RESET = "reset"
STREAM_ONLY: frozenset[str] = frozenset({SNAPSHOT, RESET})

#: Every type a stream can carry: what ``?types=`` may name.
ALL: frozenset[str] = LOGGED | STREAM_ONLY

#: Notification kinds derived from ``tasks.changed`` by the notifier (``gridd.notify``).
DERIVED_NOTIFICATIONS: frozenset[str] = frozenset({"task.failed", "tasks.all_done"})

#: What ``[notifications] events`` may name. Not ``notify.*`` (a failed notification
#: would notify again; the notifier ignores them) and nothing made per stream.
NOTIFIABLE: frozenset[str] = (
    frozenset(t for t in LOGGED if not t.startswith("notify.")) | DERIVED_NOTIFICATIONS
)


def unknown(names: Iterable[str], known: frozenset[str] = ALL) -> list[str]:
    """The names not in ``known``, sorted, each once."""
    return sorted({name for name in names if name not in known})


def unknown_message(names: list[str], known: frozenset[str], *, what: str = "event type") -> str:
    """``unknown event type 'x'; did you mean 'y'?``, naming every one of ``names``."""
    from gridd.spelling import closest  # only on a mistake

    guesses = {name: closest(name, known) for name in names}
    if len(names) == 1:
        name, guess = names[0], guesses[names[0]]
        text = f"unknown {what} '{name}'" + (f"; did you mean '{guess}'?" if guess else "")
    else:
        text = f"unknown {what}s " + ", ".join(
            f"'{n}'" + (f" (did you mean '{guesses[n]}'?)" if guesses[n] else "") for n in names
        )
    if not any(guesses.values()):
        text += " (docs/events.md lists them)"
    return text


def refuse_unknown(types: Iterable[str]) -> None:
    """Raise ``BadRequest`` (``unknown_event_type``, naming the closest known type) when any
    of ``types`` is not a type a stream can carry: what ``?types=`` and ``gridctl events
    --types`` answer a misspelt type with, instead of matching nothing forever."""
    wrong = unknown(types, ALL)
    if wrong:
        from gridd.errors import BadRequest  # only on a mistake

        raise BadRequest(
            unknown_message(wrong, ALL),
            code="unknown_event_type",
            details={"unknown": wrong, "known": sorted(ALL)},
        )
