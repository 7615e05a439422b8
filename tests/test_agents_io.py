"""An agent's output: written to a file, so a flood never blocks the agent; indexed into
contiguous chunks the API serves completely, while the daemon's memory stays bounded."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import psutil

from gridd.client import GridClient
from gridd.pool import render_command
from tests.support.daemons import core_daemon
from tests.support.repos import agent_command, read_json_file, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for

FLOOD_MB = 50
RSS_LIMIT = 300 * 1024 * 1024
# Must match tests/agents/flood.py.
LINE = ("flood \u20ac \U0001f600 " + "x" * 48).encode()[:63] + b"\n"


class PeakRSS:
    """Samples a process's resident memory in a thread; ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def read_all_output(c: GridClient, agent_id: str, *, limit: int) -> tuple[list[int], bytes]:
    """Every chunk through ``GET /agents/{id}/output``, page by page: (seqs, content)."""
    seqs: list[int] = []
    content = bytearray()
    since = 0
    while True:
        page = c.get(f"/agents/{agent_id}/output", params={"since": since, "limit": limit})
        for chunk in page["chunks"]:
            seqs.append(chunk["seq"])
            content += chunk["chunk"].encode()
        if not page["chunks"]:
            assert page["more"] is False
            return seqs, bytes(content)
        since = page["chunks"][-1]["seq"]


def test_a_50_mb_output_flood_neither_blocks_the_agent_nor_bloats_the_daemon(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo, agents={"flood": {"command": agent_command("flood.py", str(FLOOD_MB), str(tmp_path))}}
    )
    with core_daemon(repo) as daemon:
        c = daemon.client(timeout=60)
        c.post("/tasks", {"id": "flood", "title": "floods its output", "agent": "flood"})
        with PeakRSS(daemon.proc.pid) as rss:
            c.post("/tasks/flood/start")
            report = wait_for(
                lambda: read_json_file(tmp_path / "flood.json"),
                timeout=120,
                message="the agent to finish",
            )
            wait_for(
                lambda: c.get("/tasks/flood")["status"] == "review",
                timeout=120,
                message="the daemon to index the output",
            )
            agent = c.get("/agents", params={"all": "1"})[0]
            seqs, content = read_all_output(c, agent["id"], limit=50)
        total = FLOOD_MB * 1024 * 1024
        assert report["bytes"] == total
        # The agent wrote into a file, never a full pipe: it finished without waiting on us.
        print(
            f"agent wrote {FLOOD_MB} MB in {report['seconds']:.2f}s; daemon peak RSS {rss.peak / 2**20:.0f} MB"
        )
        assert report["seconds"] < 60
        assert rss.peak < RSS_LIMIT, f"daemon RSS reached {rss.peak / 2**20:.0f} MB"
        # Every byte came back, in order, with contiguous sequence numbers.
        assert seqs == list(range(1, len(seqs) + 1))
        assert agent["outputSeq"] == len(seqs)
        assert len(content) == total
        expected = hashlib.sha256(LINE * (total // len(LINE))).hexdigest()
        assert hashlib.sha256(content).hexdigest() == expected


def test_output_is_served_from_any_sequence_number_and_streamed_as_events(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo, agents={"flood": {"command": agent_command("flood.py", "1", str(tmp_path))}}
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "small", "title": "one megabyte", "agent": "flood"})
        c.post("/tasks/small/start")
        wait_for(lambda: c.get("/tasks/small")["status"] == "review", timeout=60)
        agent_id = c.get("/agents", params={"all": "1"})[0]["id"]
        full = c.get(f"/agents/{agent_id}/output")
        last = full["seq"]
        assert [ch["seq"] for ch in full["chunks"]] == list(range(1, last + 1))
        assert full["more"] is False
        # Resuming from the middle gives exactly the rest; past the end gives nothing.
        middle = last // 2
        rest = c.get(f"/agents/{agent_id}/output", params={"since": middle})
        assert rest["chunks"] == full["chunks"][middle:]
        assert c.get(f"/agents/{agent_id}/output", params={"since": last})["chunks"] == []
        page = c.get(f"/agents/{agent_id}/output", params={"since": 0, "limit": 2})
        assert [ch["seq"] for ch in page["chunks"]] == [1, 2]
        assert page["more"] is (last > 2)
        # The SSE stream carried the same chunks, in order.
        events = [e.data for e in event_log(c, types={"agent.output"})]
        assert [e["seq"] for e in events] == list(range(1, last + 1))
        assert [e["chunk"] for e in events] == [ch["chunk"] for ch in full["chunks"]]
        assert all(e["agentId"] == agent_id for e in events)
        text = "".join(ch["chunk"] for ch in full["chunks"])
        assert text.encode() == LINE * (1024 * 1024 // len(LINE))


def test_an_agent_runs_in_its_worktree_with_its_placeholders_and_environment(
    repo: Path, tmp_path: Path
) -> None:
    write_core_config(
        repo,
        agents={
            "reporter": {
                "command": agent_command(
                    "report_env.py", str(tmp_path), "{prompt}", "--task={task_id}", "{worktree}"
                ),
                "env": {"EXTRA_SETTING": "from the profile"},
            }
        },
    )
    prompt = 'fix "it"; $(touch /tmp/pwned) && echo {task_id} `id` \u00e9'
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "env-check", "title": "t", "prompt": prompt, "agent": "reporter"})
        c.post("/tasks/env-check/start")
        report = wait_for(lambda: read_json_file(tmp_path / "env-check.env.json"), timeout=30)
        task = c.get("/tasks/env-check")
        agent = c.get("/agents", params={"all": "1"})[0]
    worktree = str(repo / ".grid" / "worktrees" / "env-check")
    # Placeholders are substituted inside single arguments; no shell ever sees the prompt.
    assert report["argv"] == [prompt, "--task=env-check", worktree]
    assert report["cwd"] == worktree == task["worktree"]
    assert report["env"] == {
        "GRID_TASK_ID": "env-check",
        "GRID_AGENT_ID": agent["id"],
        "GRID_WORKSPACE": str(repo),
        "GRID_SOCKET": str(repo / ".grid" / "gridd.sock"),
        "GRID_HEARTBEAT": str(Path(agent["runDir"]) / "heartbeat.ndjson"),
        "GRID_ATTEMPT": "1",
        "GRID_SESSION": "1",
        "EXTRA_SETTING": "from the profile",
    }
    # Its own process group, so that stopping it reaches everything it started.
    assert report["pgid"] == report["pid"] == agent["pid"]


def test_placeholders_are_substituted_once_so_a_prompt_reaches_the_agent_verbatim() -> None:
    values = {"prompt": "see {worktree} and {task_id}", "task_id": "t1", "worktree": "/w"}
    command = ["agent", "{prompt}", "--id={task_id}", "{unknown}", "{worktree}/x"]
    assert render_command(command, values) == [
        "agent",
        "see {worktree} and {task_id}",
        "--id=t1",
        "{unknown}",
        "/w/x",
    ]
