"""Questions and answers through the real daemon: an agent asks (heartbeat file, or an
interactive CLI's exact prompt under a pattern pack), a human answers over the API, the
answer reaches the agent's stdin and the agent completes. Also: raw responses, conflicts
(409/422/404), questions closed when their agent exits, a slow human is not a stall, answers
after the daemon was SIGKILLed (and repeats of a question are not new questions), automatic
answers only for the pattern a profile names. The fake claude's cycle: test_claude_e2e.py."""

from __future__ import annotations

import time
from pathlib import Path

from gridd.client import GridClient
from tests.support.api import api_call, wait_pending_question, wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log, wait_for_events
from tests.support.waits import wait_for

ASKER = {"command": agent_command("ask_heartbeat.py", "Which color?", "red", "blue")}
LEAVER = {
    "command": agent_command("ask_heartbeat.py", "--exit-without-answer", "Stay or go?", "stay")
}


def start(c: GridClient, *tasks: dict[str, object]) -> None:
    for task in tasks:
        c.post("/tasks", task)
    c.post("/session/start", {"featureBranch": "feature/questions"})


# -- the heartbeat adapter's round trip ------------------------------------------------------


def test_a_heartbeat_question_is_answered_through_respond_and_the_agent_completes(
    repo: Path,
) -> None:
    write_core_config(repo, agents={"asker": ASKER}, scheduler={"default_agent": "asker"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "paint", "title": "paint the shed"})
        question = wait_pending_question(c, "paint")
        assert question["question"] == "Which color?"
        assert question["options"] == ["red", "blue"]
        assert question["type"] == "clarification"
        assert question["status"] == "pending"
        assert question["askedAt"]
        agent_id = str(question["agentId"])

        # While it waits: the task shows since when, the agent is "waiting", /state lists it.
        task = c.get("/tasks/paint")
        assert task["status"] == "working"
        assert task["waitingSince"]
        agent = c.get(f"/agents/{agent_id}")
        assert agent["status"] == "waiting"
        assert agent["waitingSince"]
        assert [q["id"] for q in c.get("/state")["pendingQuestions"]] == [question["id"]]
        assert c.get(f"/questions/{question['id']}")["status"] == "pending"
        [asked] = event_log(c, types={"agent.question"})
        assert asked.data == {
            "questionId": question["id"],
            "agentId": agent_id,
            "taskId": "paint",
            "type": "clarification",
            "question": "Which color?",
            "options": ["red", "blue"],
        }

        # covend's path answers the agent's oldest open question.
        reply = c.post(f"/agents/{agent_id}/respond", {"response": "blue"})
        assert reply["status"] == "delivered"
        assert reply["question"]["id"] == question["id"]
        assert reply["question"]["status"] == "answered"
        assert reply["question"]["answer"] == "blue"

        task = wait_task_status(c, "paint", "review")
        assert task["waitingSince"] is None
        assert "answer.txt" in task["changedFiles"]
        assert git_show(repo, "grid/paint:answer.txt") == "blue\n"
        assert c.get("/questions") == []
        [answered] = c.get("/questions", params={"all": "1"})
        assert answered["status"] == "answered"
        assert answered["answeredAt"]
        assert c.get("/state")["pendingQuestions"] == []
        assert wait_for_events(c, {"question.answered"}, 1)[0].data["questionId"] == question["id"]


def test_respond_without_a_question_sends_one_raw_line_to_stdin(repo: Path) -> None:
    profile = {"command": agent_command("read_line.py")}
    write_core_config(repo, agents={"reader": profile}, scheduler={"default_agent": "reader"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "raw", "title": "read a line"})
        agent = wait_for(
            lambda: next(
                (a for a in c.get("/agents") if a["lastOutput"] == "ready for a line"), None
            ),
            timeout=30,
            message="the agent to say it is ready",
        )
        reply = c.post(f"/agents/{agent['id']}/respond", {"response": "just some text"})
        assert reply == {"status": "delivered"}
        wait_task_status(c, "raw", "review")
        assert git_show(repo, "grid/raw:answer.txt") == "just some text\n"
        [responded] = event_log(c, types={"agent.responded"})
        assert responded.data == {"agentId": agent["id"], "taskId": "raw"}
        assert c.get("/questions", params={"all": "1"}) == []


def test_a_response_larger_than_the_pipe_buffer_reaches_the_agent_whole(repo: Path) -> None:
    profile = {"command": agent_command("read_line.py")}
    write_core_config(repo, agents={"reader": profile}, scheduler={"default_agent": "reader"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "big", "title": "read a long line"})
        agent = wait_for(
            lambda: next(
                (a for a in c.get("/agents") if a["lastOutput"] == "ready for a line"), None
            ),
            timeout=30,
            message="the agent to say it is ready",
        )
        text = "x" * 99_000  # within the API's limit, beyond a pipe's buffer
        status, body = api_call(
            daemon.sock, "POST", f"/agents/{agent['id']}/respond", {"response": text}
        )
        if status == 200:  # delivered means delivered: the agent gets the whole line
            wait_task_status(c, "big", "review", timeout=5)
            assert git_show(repo, "grid/big:answer.txt") == text + "\n"
        else:  # or refused, honestly, before anything reached the agent
            assert status in {409, 413, 422}, body


def test_a_slow_answer_does_not_make_the_agent_look_stalled(repo: Path) -> None:
    """Waiting for a human is not silence: answering after longer than the stall-kill time
    must not get the agent killed before it can act on the answer."""
    profile = {"command": agent_command("ask_heartbeat.py", "--work", "0.3", "Go?", "go")}
    write_core_config(
        repo,
        agents={"slow": profile},
        scheduler={"default_agent": "slow", "stall_seconds": 0.8, "stall_kill_seconds": 1.2},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "slow", "title": "wait for a slow human"})
        question = wait_pending_question(c, "slow")
        time.sleep(2.0)  # the human takes longer than stall_kill_seconds
        assert c.get(f"/agents/{question['agentId']}")["status"] == "waiting"
        c.post(f"/questions/{question['id']}/answer", {"response": "go"})
        wait_task_status(c, "slow", "review")
        assert git_show(repo, "grid/slow:answer.txt") == "go\n"
        unwanted = {"agent.stalled", "agent.stopped", "agent.failed"}
        assert event_log(c, types=unwanted) == []


# -- conflicts -----------------------------------------------------------------------------------


def test_answers_that_conflict_are_refused_with_409_422_and_404(repo: Path) -> None:
    write_core_config(repo, agents={"asker": ASKER}, scheduler={"default_agent": "asker"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "pick", "title": "pick a color"})
        question = wait_pending_question(c, "pick")
        qid, agent_id = question["id"], question["agentId"]

        status, body = api_call(
            daemon.sock, "POST", f"/questions/{qid}/answer", {"response": "green"}
        )
        assert status == 422
        assert body == {
            "error": {
                "code": "option_not_offered",
                "message": body["error"]["message"],  # type: ignore[index]
                "details": {"options": ["red", "blue"]},
            }
        }
        assert "green" in body["error"]["message"]  # type: ignore[index]
        assert c.get(f"/questions/{qid}")["status"] == "pending"  # a refused answer changes nothing

        status, body = api_call(
            daemon.sock, "POST", f"/questions/{qid}/answer", {"response": "red"}
        )
        assert status == 200
        assert body["status"] == "answered"  # type: ignore[index]
        assert body["answer"] == "red"  # type: ignore[index]

        status, body = api_call(
            daemon.sock, "POST", f"/questions/{qid}/answer", {"response": "blue"}
        )
        assert status == 409
        assert body["error"]["code"] == "question_answered"  # type: ignore[index]
        assert body["error"]["details"]["status"] == "answered"  # type: ignore[index]

        status, body = api_call(daemon.sock, "POST", "/questions/q-99999/answer", {"response": "x"})
        assert status == 404
        assert body["error"]["code"] == "question_not_found"  # type: ignore[index]
        assert api_call(daemon.sock, "GET", "/questions/q-99999")[0] == 404

        wait_task_status(c, "pick", "review")
        assert git_show(repo, "grid/pick:answer.txt") == "red\n"
        status, body = api_call(
            daemon.sock, "POST", f"/agents/{agent_id}/respond", {"response": "x"}
        )
        assert status == 409, body
        assert body["error"]["code"] in {"agent_not_running", "agent_exited"}  # type: ignore[index]


def test_an_agent_that_exits_with_a_question_open_closes_it(repo: Path) -> None:
    write_core_config(repo, agents={"leaver": LEAVER}, scheduler={"default_agent": "leaver"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "leave", "title": "ask and leave"})
        [asked] = wait_for_events(c, {"agent.question"}, 1)
        qid = asked.data["questionId"]
        [closed] = wait_for_events(c, {"question.closed"}, 1)
        assert closed.data["questionId"] == qid
        assert closed.data["agentId"] == asked.data["agentId"]
        assert "exited" in closed.data["reason"]

        question = c.get(f"/questions/{qid}")
        assert question["status"] == "closed"
        assert question["closedReason"] == closed.data["reason"]
        assert c.get("/questions") == []
        assert [q["id"] for q in c.get("/questions", params={"all": "1"})] == [qid]
        assert c.get("/state")["pendingQuestions"] == []

        status, body = api_call(
            daemon.sock, "POST", f"/questions/{qid}/answer", {"response": "stay"}
        )
        assert status == 409
        assert body["error"]["code"] == "question_closed"  # type: ignore[index]
        assert body["error"]["details"]["closedReason"] == closed.data["reason"]  # type: ignore[index]

        task = wait_task_status(c, "leave", "review")  # it exited 0: its run is judged as usual
        assert task["waitingSince"] is None
        agent = c.get(f"/agents/{asked.data['agentId']}")
        assert agent["status"] == "exited"
        assert agent["waitingSince"] is None


# -- restarts ------------------------------------------------------------------------------------


def test_a_question_asked_before_a_daemon_crash_is_answered_after_it(repo: Path) -> None:
    write_core_config(repo, agents={"asker": ASKER}, scheduler={"default_agent": "asker"})
    with core_daemon(repo) as first:
        c = first.client()
        start(c, {"id": "crash", "title": "survive a crash"})
        question = wait_pending_question(c, "crash")
        first.kill9()

        with core_daemon(repo) as second:
            c2 = second.client()
            assert [q["id"] for q in c2.get("/questions")] == [question["id"]]
            assert c2.get("/tasks/crash")["waitingSince"]
            assert c2.get(f"/agents/{question['agentId']}")["status"] == "waiting"
            wait_for_events(c2, {"agent.reattached"}, 1)
            answered = c2.post(f"/questions/{question['id']}/answer", {"response": "red"})
            assert answered["status"] == "answered"
            wait_task_status(c2, "crash", "review")
            assert git_show(repo, "grid/crash:answer.txt") == "red\n"
            # Asked once, answered once: the restart did not ask it again.
            assert len(c2.get("/questions", params={"all": "1"})) == 1


def test_a_question_beaten_again_after_a_restart_is_not_asked_twice(repo: Path) -> None:
    """The heartbeat contract lets a worker repeat its question while it waits; a new
    daemon reading those repeats must recognise the question it already holds."""
    profile = {"command": agent_command("ask_loop.py", "First?", "Second?")}
    write_core_config(repo, agents={"looper": profile}, scheduler={"default_agent": "looper"})
    with core_daemon(repo) as first:
        c = first.client()
        start(c, {"id": "loop", "title": "ask twice"})
        one = wait_pending_question(c, "loop")
        assert one["question"] == "First?"
        c.post(f"/questions/{one['id']}/answer", {"response": "yes"})
        two = wait_for(
            lambda: next((q for q in c.get("/questions") if q["question"] == "Second?"), None),
            timeout=30,
            message="the second question",
        )
        time.sleep(0.5)  # repeats of a waiting question are not new questions
        assert [q["id"] for q in c.get("/questions")] == [two["id"]]
        first.kill9()

        with core_daemon(repo) as second:
            c2 = second.client()
            wait_for_events(c2, {"agent.reattached"}, 1)
            time.sleep(0.8)  # several repeats read by the new daemon
            assert [q["id"] for q in c2.get("/questions")] == [two["id"]]
            c2.post(f"/questions/{two['id']}/answer", {"response": "no"})
            wait_task_status(c2, "loop", "review")
            assert git_show(repo, "grid/loop:answers.txt") == "yes\nno\n"
            assert len(c2.get("/questions", params={"all": "1"})) == 2


# -- the patterns adapter, with aider's exact prompt ---------------------------------------------

AIDER_OPTIONS = ["yes", "no", "all", "skip all", "don't ask again"]


def aider_profile(*args: str, auto: dict[str, str] | None = None) -> dict[str, object]:
    options: dict[str, object] = {"pack": "aider"}
    if auto:
        options["auto_answer"] = auto
    return {
        "command": agent_command("aider_prompt.py", *args),
        "adapter": "patterns",
        "adapter_options": options,
    }


def test_an_aider_prompt_becomes_a_question_and_its_answer_reaches_the_cli(repo: Path) -> None:
    write_core_config(
        repo, agents={"aider": aider_profile("--decoy")}, scheduler={"default_agent": "aider"}
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "aid", "title": "add a file"})
        question = wait_pending_question(c, "aid")
        assert question["question"] == "Add file to the chat? (notes.txt)"
        assert question["options"] == AIDER_OPTIONS
        assert question["type"] == "decision"
        # The decoy line ending in "?" came first and was never taken for a question.
        assert len(event_log(c, types={"agent.question"})) == 1
        assert c.get(f"/agents/{question['agentId']}")["status"] == "waiting"

        status, body = api_call(
            daemon.sock, "POST", f"/questions/{question['id']}/answer", {"response": "maybe"}
        )
        assert status == 422, body
        # The key the CLI reads is accepted as well as the option's label.
        answered = c.post(f"/questions/{question['id']}/answer", {"response": "y"})
        assert answered["answer"] == "yes"
        wait_task_status(c, "aid", "review")
        assert git_show(repo, "grid/aid:answer.txt") == "y\n"
        assert len(c.get("/questions", params={"all": "1"})) == 1


def test_a_configured_auto_answer_answers_that_pattern_without_a_human(repo: Path) -> None:
    profile = aider_profile(auto={"aider.add_file": "yes"})
    write_core_config(repo, agents={"aider": profile}, scheduler={"default_agent": "aider"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, {"id": "auto", "title": "add a file, automatically"})
        [auto] = wait_for_events(c, {"agent.auto_answered"}, 1)
        assert auto.data["answer"] == "yes"
        assert auto.data["question"] == "Add file to the chat? (notes.txt)"
        wait_task_status(c, "auto", "review")
        assert git_show(repo, "grid/auto:answer.txt") == "y\n"  # exactly what a human's "yes" sends
        assert c.get("/questions", params={"all": "1"}) == []
        assert event_log(c, types={"agent.question"}) == []


def test_a_cli_prompt_pending_at_a_daemon_crash_is_answered_after_it(repo: Path) -> None:
    write_core_config(
        repo, agents={"aider": aider_profile("--twice")}, scheduler={"default_agent": "aider"}
    )
    with core_daemon(repo) as first:
        c = first.client()
        start(c, {"id": "crash", "title": "two prompts and a crash"})
        one = wait_pending_question(c, "crash")
        c.post(f"/questions/{one['id']}/answer", {"response": "yes"})
        two = wait_for(
            lambda: next((q for q in c.get("/questions") if q["id"] != one["id"]), None),
            timeout=30,
            message="the second prompt",
        )
        assert two["question"] == "Add file to the chat? (todo.txt)"
        first.kill9()

        with core_daemon(repo) as second:
            c2 = second.client()
            wait_for_events(c2, {"agent.reattached"}, 1)
            assert [q["id"] for q in c2.get("/questions")] == [two["id"]]
            c2.post(f"/questions/{two['id']}/answer", {"response": "n"})
            wait_task_status(c2, "crash", "review")
            assert git_show(repo, "grid/crash:answer.txt") == "y\nn\n"
            questions = c2.get("/questions", params={"all": "1"})
            assert [(q["id"], q["answer"]) for q in questions] == [
                (one["id"], "yes"),
                (two["id"], "no"),
            ]
