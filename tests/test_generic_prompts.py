"""The generic prompt pack (gridd/adapters/packs/generic.py) for plain CLIs: a yes/no or
numbered-choice prompt left waiting on the last line becomes a question with those options,
exactly, and its answer reaches the CLI as the key it reads; ordinary output never asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridd.adapters.base import Ask
from gridd.adapters.patterns import PatternsAdapter
from gridd.errors import ValidationFailed
from tests.support.api import wait_pending_question, wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log


def asks(*chunks: str) -> list[Ask]:
    adapter = PatternsAdapter(pack="generic")
    return [s for chunk in chunks for s in adapter.feed_output(chunk) if isinstance(s, Ask)]


@pytest.mark.parametrize(
    ("waiting", "question", "options", "pattern"),
    [
        ("Proceed? (y/n) ", "Proceed?", ["yes", "no"], "generic.yes_no"),
        ("Overwrite hello.txt? [y/N]: ", "Overwrite hello.txt?", ["yes", "no"], "generic.yes_no"),
        ("Continue [Y/n]? ", "Continue", ["yes", "no"], "generic.yes_no"),
        (
            "Delete the branch? (yes/no) ",
            "Delete the branch?",
            ["yes", "no"],
            "generic.yes_no_words",
        ),
        (
            "Pick a color: [1] red [2] blue: ",
            "Pick a color:",
            ["red", "blue"],
            "generic.numbered",
        ),
        (
            "[1] keep mine [2] take theirs [3] merge both> ",
            "Choose one",
            ["keep mine", "take theirs", "merge both"],
            "generic.numbered",
        ),
    ],
)
def test_a_waiting_yes_no_or_numbered_prompt_becomes_one_question_however_it_is_chunked(
    waiting: str, question: str, options: list[str], pattern: str
) -> None:
    text = "building...\nok\n" + waiting
    for cut in range(1, len(text)):
        [ask] = asks(text[:cut], text[cut:])
        assert (ask.question, ask.options, ask.meta["pattern"]) == (question, options, pattern)


@pytest.mark.parametrize(
    "output",
    [
        "Should I also update the tests?",
        "Proceed? (y/n) \n",  # answered already: more output followed
        "Proceed? (y/n) and then some",
        "the flag (y/n) is documented below ",
        "[1/3] compiling ",
        "[0] zero [1] one: ",
        "[1] one [3] three: ",
        "[1] same [2] same: ",
        "[1] red [2] blue ",  # no end mark: it may still be printing
        "see [1] for details ",
        "Run tests? (Y)es/(N)o [Yes]: ",  # aider's: its own pack, not this one
        "(y/n) ",
    ],
)
def test_ordinary_output_is_never_a_question(output: str) -> None:
    assert asks("some output\n" + output) == []


def test_answers_are_sent_as_the_keys_the_cli_reads_and_nothing_else_is_taken() -> None:
    adapter = PatternsAdapter(pack="generic")
    [ask] = [s for s in adapter.feed_output("Pick: [1] red [2] blue: ") if isinstance(s, Ask)]
    assert adapter.encode_answer(ask, "blue") == "2\n"
    assert adapter.encode_answer(ask, "1") == "1\n"
    with pytest.raises(ValidationFailed):
        adapter.encode_answer(ask, "green")
    [yes_no] = [s for s in adapter.feed_output("\nSure? [y/N] ") if isinstance(s, Ask)]
    assert adapter.encode_answer(yes_no, "yes") == "y\n"
    assert adapter.encode_answer(yes_no, "N") == "n\n"


@pytest.mark.parametrize(
    ("prompt", "options", "response", "sent"),
    [
        ("Proceed? (y/n) ", ["yes", "no"], "yes", "y\n"),
        ("Pick a color: [1] red [2] blue: ", ["red", "blue"], "blue", "2\n"),
    ],
)
def test_a_plain_cli_prompt_is_asked_and_its_answer_reaches_the_cli(
    repo: Path, prompt: str, options: list[str], response: str, sent: str
) -> None:
    profile = {
        "command": agent_command("plain_prompt.py", prompt),
        "adapter": "patterns",
        "adapter_options": {"pack": "generic"},
    }
    write_core_config(repo, agents={"plain": profile}, scheduler={"default_agent": "plain"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "ask", "title": "ask", "prompt": "go"})
        c.post("/session/start", {"featureBranch": "feature/plain"})
        question = wait_pending_question(c, "ask")
        assert question["options"] == options
        # The lines that only look like questions came first and asked nothing.
        assert len(event_log(c, types={"agent.question"})) == 1
        c.post(f"/questions/{question['id']}/answer", {"response": response})
        wait_task_status(c, "ask", "review")
        assert git_show(repo, "grid/ask:answer.txt") == sent
