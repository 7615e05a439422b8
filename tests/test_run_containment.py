"""Stop means stopped: every process a run started dies with the run, whichever way the run
ends (stop, kill, session stop, timeout, or the agent's own exit), even the ones that left
the agent's process group with ``setsid()`` or ``setpgid()``, or whose parent exited.

The shim is the agent's child subreaper and ends everything below it when the agent ends
(``runs/shim.py``). Real daemon, real shims, real processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.daemons import core_daemon
from tests.support.processes import process_gone
from tests.support.repos import agent_command, read_json_file, write_core_config
from tests.support.waits import wait_for

#: How a run ends, and what the test does to end it.
MODES = ["stop", "kill", "session_stop", "timeout", "exit"]


def _escapees(pid_dir: Path, task_id: str) -> list[int]:
    text = wait_for(
        lambda: (
            (pid_dir / f"{task_id}.escapees").exists()
            and (pid_dir / f"{task_id}.escapees").read_text()
        ),
        timeout=30,
        message="the agent's escaping children to run",
    )
    pids: list[int] = json.loads(text)
    return pids


@pytest.mark.parametrize("mode", MODES)
def test_no_process_a_run_started_outlives_it(repo: Path, tmp_path: Path, mode: str) -> None:
    ending = "exit" if mode == "exit" else "hang"
    write_core_config(
        repo,
        agents={"escape": {"command": agent_command("escapees.py", str(tmp_path), ending)}},
        scheduler={"default_agent": "escape", "stop_when_idle": False},
    )
    task: dict[str, object] = {"id": "esc", "title": "leaves children", "maxAttempts": 1}
    if mode == "timeout":
        task["timeoutSeconds"] = 3
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", task)
        c.post("/session/start", {"maxAgents": 1})
        pids = _escapees(tmp_path, "esc")
        if mode != "exit":  # an exiting agent's children may be gone already: rightly
            assert not any(process_gone(p) for p in pids)
        (agent,) = c.get("/agents")
        if mode == "stop":
            c.post("/tasks/esc/stop")
        elif mode == "kill":
            c.post(f"/agents/{agent['id']}/kill")
        elif mode == "session_stop":
            c.post("/session/stop")
        run_dir = Path(agent["runDir"])
        wait_for(lambda: read_json_file(run_dir / "exit.json"), timeout=30, message="run's end")
        wait_for(
            lambda: all(process_gone(p) for p in pids),
            timeout=5,
            message=f"every process the run started to be gone ({mode})",
        )
