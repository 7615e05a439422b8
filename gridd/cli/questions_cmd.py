"""``gridctl questions``, ``gridctl answer`` and ``gridctl respond``: agents waiting for a person.

An agent that needs a person asks a question, with options or for free text; the daemon
keeps it until it is answered or the agent exits. ``answer QUESTION_ID TEXT`` answers one;
``answer`` alone, on a terminal, walks a person through picking a question and an answer.
That walk is ``choose_question`` and ``choose_answer``: pure functions of an ``ask`` (prompt
in, typed line out, ``EOFError`` at the end of input) and a ``say``, so they are tested
without a terminal. ``respond`` is covend's path: it answers the agent's oldest open
question, or sends the text to the agent's standard input as one line when it has none.
The daemon decides whether an answer is acceptable (409: gone or answered; 422: not an
offered option, with the options in ``details``); ``gridctl`` prints its reasons.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime

from gridd.cli import render, render_questions
from gridd.cli.context import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Command, Context, segment
from gridd.errors import GriddError
from gridd.model import Question, QuestionStatus

#: Reads one line after showing a prompt; raises EOFError when input has ended.
Ask = Callable[[str], str]
#: Shows one message (one or more lines) to the person.
Say = Callable[[str], None]

ANSWER_USAGE = (
    "usage: gridctl answer QUESTION_ID TEXT\n"
    "gridctl answer: without TEXT it asks interactively, which needs a terminal on standard"
    " input; list the questions with 'gridctl questions'"
)


def _questions(data: object) -> list[Question]:
    if not isinstance(data, list):
        raise GriddError("the daemon sent a question list that is not a list", code="bad_response")
    questions = [render.parse_wire(Question, item) for item in data]
    return sorted(questions, key=lambda q: q.asked_at)


# -- the interactive walk (pure) ---------------------------------------------------------------


def describe(question: Question, *, now: datetime | None = None) -> str:
    """One question for a person choosing: id, where it comes from, how long it has waited,
    then the question itself."""
    head = (
        f"{question.id}  task {question.task_id}, agent {question.agent_id}, {question.type},"
        f" waiting {render.waited(question.asked_at, now=now)}"
    )
    body = "\n".join(f"     {line}" for line in question.question.splitlines() or [""])
    return f"{head}\n{body}"


def choose_question(
    questions: Sequence[Question], *, ask: Ask, say: Say, now: datetime | None = None
) -> Question:
    """Lists ``questions`` numbered and asks which: a number, an id, or Enter for the first."""
    if not questions:
        raise ValueError("nothing to choose from")
    for number, question in enumerate(questions, start=1):
        say(f"{number:>2}) {describe(question, now=now)}")
    count = len(questions)
    while True:
        reply = ask(f"which question? [1-{count}, Enter for 1] ").strip()
        if not reply:
            return questions[0]
        if reply.isdigit() and 1 <= int(reply) <= count:
            return questions[int(reply) - 1]
        by_id = [q for q in questions if q.id == reply]
        if by_id:
            return by_id[0]
        say(f"type a number from 1 to {count}, or press Enter for the first")


def choose_answer(question: Question, *, ask: Ask, say: Say) -> str:
    """Shows the question and its options and asks for the answer: an option's number or
    any text (the daemon decides whether text that is not an option is acceptable)."""
    say(f"{question.type}: {question.question}")
    options = question.options
    for number, option in enumerate(options, start=1):
        say(f"  {number}) {option}")
    prompt = f"answer [1-{len(options)} or text] " if options else "answer "
    while True:
        reply = ask(prompt).strip()
        if not reply:
            say("an empty answer is not sent; type one (Ctrl-D to give up)")
            continue
        if reply in options:
            return reply
        if options and reply.isdigit() and 1 <= int(reply) <= len(options):
            return options[int(reply) - 1]
        return reply


def interactive_answer(
    questions: Sequence[Question], *, ask: Ask, say: Say, now: datetime | None = None
) -> tuple[Question, str] | None:
    """The whole walk: which question, then which answer; None when there is no question.
    ``EOFError`` from ``ask`` (the person gave up) propagates."""
    if not questions:
        say("no pending questions")
        return None
    question = choose_question(questions, ask=ask, say=say, now=now)
    return question, choose_answer(question, ask=ask, say=say)


# -- questions -----------------------------------------------------------------------------------


def build_questions(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--all", action="store_true", help="include answered and closed questions")
    parser.add_argument("--json", action="store_true", help="print the raw question list as JSON")


def run_questions(ctx: Context) -> int:
    data = ctx.client().get("/questions", params={"all": "1"} if ctx.args.all else None)
    if ctx.args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    questions = _questions(data)
    if ctx.args.all:
        table = render_questions.questions_table(questions, empty="no questions", title="questions")
    else:
        table = render_questions.questions_table(questions)
    render.console().print(table)
    return EXIT_OK


QUESTIONS = Command(
    help="list the questions agents are waiting on (--all: also answered and closed ones)",
    description="List pending questions: id, agent, task, type, the question, its options and"
    " how long it has waited. Answer one with 'gridctl answer'.",
    build=build_questions,
    run=run_questions,
)


# -- answer --------------------------------------------------------------------------------------


def build_answer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "question_id",
        metavar="QUESTION_ID",
        nargs="?",
        help="the question to answer (default: choose one interactively)",
    )
    parser.add_argument(
        "text",
        metavar="TEXT",
        nargs="?",
        help="the answer: one of the offered options (any case) or, when the question takes"
        " it, free text (default: asked interactively)",
    )


def _send_answer(ctx: Context, question_id: str, text: str) -> int:
    data = ctx.client().post(
        f"/questions/{segment(question_id, kind='question')}/answer", {"response": text}
    )
    answered = render.parse_wire(Question, data)
    print(
        f"answered {answered.id} (task {answered.task_id}, agent {answered.agent_id}):"
        f" {answered.answer if answered.answer is not None else text}"
    )
    return EXIT_OK


def _terminal_prompts() -> tuple[Ask, Say]:
    def say(message: str) -> None:
        print(message, flush=True)

    return input, say


def run_answer(ctx: Context) -> int:
    args = ctx.args
    if args.question_id is not None and args.text is not None:
        return _send_answer(ctx, args.question_id, args.text)
    if not sys.stdin.isatty():
        print(ANSWER_USAGE, file=sys.stderr)
        return EXIT_USAGE
    ask, say = _terminal_prompts()
    client = ctx.client()
    try:
        if args.question_id is None:
            chosen = interactive_answer(_questions(client.get("/questions")), ask=ask, say=say)
            if chosen is None:
                return EXIT_OK
            question, text = chosen
        else:
            question = render.parse_wire(
                Question, client.get(f"/questions/{segment(args.question_id, kind='question')}")
            )
            if question.status != QuestionStatus.PENDING:
                raise GriddError(
                    f"question {question.id} is already {question.status.value}",
                    code=f"question_{question.status.value}",
                    details={"closedReason": question.closed_reason},
                )
            text = choose_answer(question, ask=ask, say=say)
    except EOFError:
        print("", flush=True)
        ctx.note("no answer sent")
        return EXIT_ERROR
    return _send_answer(ctx, question.id, text)


ANSWER = Command(
    help="answer an agent's question (no arguments: choose one interactively)",
    description="Answer a pending question: 'gridctl answer QUESTION_ID TEXT'. With no"
    " arguments (on a terminal) it lists the pending questions, asks which one (Enter for"
    " the first) and asks for the answer (an option's number, or text). Answering a"
    " question that is gone or already answered, or with an option it does not offer,"
    " exits 1 with the daemon's reason (and the offered options).",
    build=build_answer,
    run=run_answer,
)


# -- respond -------------------------------------------------------------------------------------


def build_respond(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("agent_id", metavar="AGENT_ID", help="the agent to respond to")
    parser.add_argument("text", metavar="TEXT", help="the response")


def run_respond(ctx: Context) -> int:
    agent_id = ctx.args.agent_id
    reply = ctx.client().post(
        f"/agents/{segment(agent_id, kind='agent')}/respond", {"response": ctx.args.text}
    )
    question = reply.get("question") if isinstance(reply, dict) else None
    if question is not None:
        answered = render.parse_wire(Question, question)
        print(f"answered {answered.id} of agent {agent_id}: {answered.answer}")
    else:
        print(f"sent one line to agent {agent_id}'s standard input")
    return EXIT_OK


RESPOND = Command(
    help="respond to an agent: its oldest open question, or one line on its stdin",
    description="covend's respond: answer the agent's oldest pending question with TEXT or,"
    " when it has none, write TEXT as one line to its standard input. Exits 1 when the"
    " agent is not running or TEXT is not an option its question offers.",
    build=build_respond,
    run=run_respond,
)
