"""PURE: what an agent's exit means for its task.

Given the facts of one finished run (exit status, why gridd stopped it if it did, what its
adapter and heartbeats said), decide one outcome. The pool applies it; this module does no
I/O, so every rule here is tested without a process.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime

#: EX_TEMPFAIL from sysexits.h: "try again later", i.e. please continue in a new session.
EX_TEMPFAIL = 75
#: The shell's "command not found" / "cannot execute".
EXEC_FAILED = frozenset({126, 127})


@dataclass(frozen=True)
class RunFacts:
    exit_code: int | None
    signal: int | None = None
    error: str | None = None  # from the shim (the command could not start)
    stop_reason: str | None = None  # gridd asked it to stop (timeout, stall, user)
    task_wants_run: bool = True  # the task is still ``working``
    continue_requested: bool = False
    summary: str = ""
    rate_limited_until: datetime | None = None
    rate_limited: bool = False
    launch_failed: bool = False
    result_ok: bool | None = None  # the agent's own verdict, when its adapter reports one
    result_text: str = ""  # what that verdict said (an error's context for the retry)
    #: gridd ended the conversation after the agent's final result (closed its stdin): the
    #: exit status then says nothing (claude exits 1 after an error turn), the result does.
    session_ended: bool = False
    attempts: int = 1
    max_attempts: int = 3
    sessions: int = 1
    max_sessions: int = 5
    recent_failures: int = 0  # failures of this task within the flapping window, this one too
    flap_limit: int = 5
    #: Nothing of gridd's (a stop, kill or timeout) reached the running agent: it ended on its
    #: own, even if a stop was asked for (or its task moved on) after that. A run that
    #: completed first keeps its result.
    ended_first: bool = False

    @property
    def code(self) -> int:
        if self.exit_code is not None:
            return self.exit_code
        return 128 + (self.signal or 0)


@dataclass(frozen=True)
class Stopped:
    reason: str


@dataclass(frozen=True)
class Completed:
    pass


@dataclass(frozen=True)
class Continue:
    summary: str


@dataclass(frozen=True)
class RateLimit:
    until: datetime | None  # None: use the configured backoff


@dataclass(frozen=True)
class Retry:
    error: str


@dataclass(frozen=True)
class Fail:
    error: str


@dataclass(frozen=True)
class Block:
    error: str


Outcome = Stopped | Completed | Continue | RateLimit | Retry | Fail | Block


def describe_exit(facts: RunFacts) -> str:
    if facts.stop_reason:
        return facts.stop_reason
    if facts.error:
        return facts.error
    # After its final result the exit says nothing: a CLI slow to exit then is signalled by
    # gridd itself (stopping.end_conversation), and its error result is still why it failed.
    if facts.result_ok is False and (facts.code == 0 or facts.session_ended):
        detail = " ".join(facts.result_text.split())[:500]
        return (
            f"the agent reported an error: {detail}"
            if detail
            else "the agent reported an error result"
        )
    if facts.signal:
        return f"killed by signal {signal.Signals(facts.signal).name}"
    return f"exited with code {facts.code}"


def succeeded(facts: RunFacts) -> bool:
    """The run's own verdict, whatever gridd wanted of it: it did its work and asked for
    nothing more (no continuation, no rate limit, no launch failure)."""
    if facts.launch_failed or facts.rate_limited:
        return False
    if facts.exit_code in EXEC_FAILED and facts.error:
        return False
    if facts.continue_requested or facts.exit_code == EX_TEMPFAIL:
        return False
    if facts.session_ended and facts.result_ok is True:
        return True
    return facts.exit_code == 0 and facts.result_ok is not False


def decide(facts: RunFacts) -> Outcome:
    if facts.ended_first and succeeded(facts):
        # Completed before any stop reached it: a stop, kill or cancel that came after the
        # run's end changes nothing about how it ended. Its result is kept (``review``, or
        # on a kept branch when the task was cancelled meanwhile).
        return Completed()
    if not facts.task_wants_run:
        return Stopped(facts.stop_reason or "stopped")
    if facts.launch_failed:
        return Block(f"launch failed: {facts.stop_reason or 'no sign of life'}")
    if facts.exit_code in EXEC_FAILED and facts.error:
        return Block(f"cannot start the agent command: {facts.error}")
    if facts.rate_limited:
        return RateLimit(facts.rate_limited_until)
    clean = facts.stop_reason is None
    wants_more = facts.continue_requested or facts.exit_code == EX_TEMPFAIL
    if clean and wants_more and facts.exit_code in (0, EX_TEMPFAIL):
        if facts.sessions < facts.max_sessions:
            return Continue(facts.summary)
        return Block(f"asked to continue after {facts.sessions} session(s), the task's maxSessions")
    if clean and facts.session_ended and facts.result_ok is True:
        return Completed()
    if clean and facts.exit_code == 0 and facts.result_ok is not False:
        return Completed()
    error = describe_exit(facts)
    if facts.recent_failures >= facts.flap_limit:
        return Fail(f"flapping: {facts.recent_failures} failures in a short window; last: {error}")
    if facts.attempts >= facts.max_attempts:
        return Fail(error)
    return Retry(error)
