"""PURE: what a run's exit means when a stop raced it (``outcome.decide``).

``ended_first``: nothing of gridd's could have made the agent exit as it did (no signal it
handles reached it while it ran). Then a run that completed keeps its result, whether the
task still wants it or a stop, kill or cancel moved the task meanwhile; a run that did not
complete is stopped as before."""

from __future__ import annotations

from gridd.outcome import Completed, Continue, Fail, Retry, RunFacts, Stopped, decide


def test_a_run_that_completed_before_a_stop_reached_it_keeps_its_result() -> None:
    for stop in ("task stopped by user", "killed by user", "task no longer working"):
        facts = RunFacts(exit_code=0, stop_reason=stop, task_wants_run=False, ended_first=True)
        assert decide(facts) == Completed()
        # It caught the stop's SIGTERM and exited 0: that may be the stop's doing. Stopped.
        handled = RunFacts(exit_code=0, stop_reason=stop, task_wants_run=False, ended_first=False)
        assert decide(handled) == Stopped(stop)


def test_a_run_that_ended_first_without_completing_is_stopped_when_its_task_moved_on() -> None:
    for facts in (
        RunFacts(exit_code=1, stop_reason="stop", task_wants_run=False, ended_first=True),
        RunFacts(exit_code=None, signal=15, task_wants_run=False, ended_first=True),
        RunFacts(exit_code=75, task_wants_run=False, ended_first=True),  # wanted a session more
        RunFacts(exit_code=0, result_ok=False, task_wants_run=False, ended_first=True),
        RunFacts(exit_code=0, rate_limited=True, task_wants_run=False, ended_first=True),
    ):
        assert isinstance(decide(facts), Stopped), facts


def test_a_timeout_that_came_after_a_clean_exit_does_not_fail_the_run() -> None:
    late = RunFacts(exit_code=0, stop_reason="timeout after 5s", ended_first=True)
    assert decide(late) == Completed()
    # The timeout's SIGTERM, caught, before the exit: a failed attempt as before.
    caught = RunFacts(exit_code=0, stop_reason="timeout after 5s")
    assert decide(caught) == Retry("timeout after 5s")


def test_a_run_nothing_stopped_is_decided_as_before() -> None:
    assert decide(RunFacts(exit_code=0, ended_first=True)) == Completed()
    assert decide(RunFacts(exit_code=75, summary="more", ended_first=True)) == Continue("more")
    assert decide(RunFacts(exit_code=2, ended_first=True)) == Retry("exited with code 2")


def test_an_error_result_is_the_failure_even_when_the_cli_lingered_and_was_signalled() -> None:
    """The CLI said its turn failed, gridd ended the conversation, and the CLI was slow to
    exit (opencode under load): the TERM that ended it is gridd's own, the result is why."""
    facts = RunFacts(
        exit_code=None,
        signal=15,
        session_ended=True,
        result_ok=False,
        result_text="APIError: the stand-in refuses this request",
        max_attempts=1,
    )
    outcome = decide(facts)
    assert isinstance(outcome, Fail)
    assert (
        outcome.error == "the agent reported an error: APIError: the stand-in refuses this request"
    )
