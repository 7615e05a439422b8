"""The kubernetes executor against a stand-in cluster: kmock as the API server, with a
stand-in kubelet, garbage collector and exec websocket (``tests/kube_standin.py``), the
real lightkube client and the real in-box shim in each pod's directory.

What this proves: the Job (every cap), the claim (409), the run protocol over the exec
websocket (files in, looks, answers, signals, the result bundle out), reattach by label
after a restart, cancel and its propagation (also while the pod is Pending), the exit
reasons read from the Job and its pod, and a quota (its 403, or its refusal of the Job's
pod) as "not started". What it cannot: a real scheduler, kubelet or cgroup
(an OOM kill, an eviction, a deadline are set on the objects as the cluster would set them),
and a real API server's exec (the stand-in speaks the same channel protocol)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gridd.cli.render_agents import agents_table
from gridd.client import AsyncGridClient
from gridd.errors import Conflict, GriddError
from gridd.grid import Grid
from gridd.model import TaskStatus
from gridd.runs.boxes import BoxError, BoxGone
from gridd.runs.kubernetes import (
    KubernetesEngine,
    exit_reason,
    job_manifest,
    k8s_name,
    quota_refusal,
)
from gridd.runs.remote import RemoteExecutor
from gridd.settings import KubernetesSettings
from gridd.specs import PlanSpec, SessionStart, normalise_plan
from tests.kube_standin import NODE, FakeCluster
from tests.support.daemons import inprocess_daemon, start_daemon
from tests.support.git import git_show
from tests.support.processes import kill_workspace_agents
from tests.support.repos import agent_command, toml_value, write_config
from tests.test_remote_runs import first_line, start_tasks, until

pytestmark = [pytest.mark.xdist_group("kubernetes")]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    with FakeCluster(tmp_path / "nodes") as fake:
        yield fake


@pytest.fixture
def engine(cluster: FakeCluster) -> Iterator[KubernetesEngine]:
    """An engine on the stand-in, closed after the test (its pod watch's thread with it)."""
    made = KubernetesEngine(k8s_settings(cluster))
    try:
        yield made
    finally:
        made.close()


def k8s_settings(cluster: FakeCluster, **changes: Any) -> KubernetesSettings:
    values: dict[str, Any] = {
        "server": cluster.url,
        "namespace": "grid",
        "image": "registry.example/gridd-box:1",
        "look_seconds": 0.1,
        "start_timeout_seconds": 30,
    }
    return KubernetesSettings(**(values | changes))


def executor(repo: Path, cluster: FakeCluster, **changes: Any) -> RemoteExecutor:
    settings = k8s_settings(cluster, **changes)
    return RemoteExecutor(
        KubernetesEngine(settings),
        workspace=repo,
        look_seconds=settings.look_seconds,
        environ=os.environ,
    )


#: A start that would wait this long for its pod: past any test's end, so that what ends
#: it sooner (a cancel, a quota's refusal, a restart) shows.
PATIENT: dict[str, Any] = {"start_timeout_seconds": 600}


@asynccontextmanager
async def kube_daemon(
    repo: Path, cluster: FakeCluster, cfg: dict[str, object] | None = None, **settings: Any
) -> AsyncIterator[Grid]:
    """An in-process daemon whose runs are Jobs on the stand-in (``settings`` changing
    ``k8s_settings``), by default of one profile that reads a line (``read_line.py``); the
    workspace's agents are killed after it, whatever happened."""
    if cfg is None:
        cfg = config(reader=agent_command("read_line.py"))
    try:
        async with inprocess_daemon(
            repo, cfg, executor=executor(repo, cluster, **settings)
        ) as daemon:
            yield daemon.grid
    finally:
        kill_workspace_agents(repo)


def config(**agents: list[str]) -> dict[str, object]:
    return {
        "scheduler": {
            "default_agent": next(iter(agents)),
            "tick_seconds": 0.25,
            "backoff_seconds": 0.5,
            "max_attempts": 2,
        },
        "agents": {name: {"command": argv} for name, argv in agents.items()},
        "executors": {"default": "kubernetes"},
    }


def start_two_tasks(grid: Grid, *, max_agents: int) -> None:
    """Tasks ``one`` and ``two``, in a session of at most ``max_agents`` runs at once."""
    tasks = {"tasks": [{"id": "one", "title": "a"}, {"id": "two", "title": "b"}]}
    grid.commands.create_tasks(PlanSpec.model_validate(normalise_plan(tasks)).tasks)
    grid.commands.start_session(SessionStart.model_validate({"maxAgents": max_agents}))


def events(grid: Grid, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in grid.state.store.events_after(0, types=[kind])]


def assert_not_started_yet(refused: dict[str, Any]) -> None:
    """``refused`` (a ``task.start_failed``) is a quota's: the start counted no attempt."""
    assert refused["counted"] is False
    assert "exceeded quota" in str(refused["error"]), refused


def assert_started_on_its_first_attempt(grid: Grid, task_id: str) -> None:
    """The task's run started after its refusals, which spent no attempt and failed no agent."""
    assert grid.state.tasks[task_id].attempts == 1
    assert events(grid, "agent.failed") == []


# -- the Job ------------------------------------------------------------------------------


def test_the_job_carries_every_cap_and_secrets_only_by_reference() -> None:
    settings = KubernetesSettings(
        namespace="agents",
        image="registry.example/gridd-box:1",
        service_account="gridd-runner",
        runtime_class="gvisor",
        cpu="500m",
        memory="1Gi",
        deadline_seconds=7200,
        ttl_seconds=600,
        secret_env={"ANTHROPIC_API_KEY": "anthropic/api-key"},
    )
    job = job_manifest(
        settings,
        box="grid-1a2b3c4d-claude-7",
        labels={"grid.workspace": "ab12", "grid.task": "fix login", "grid.run": "claude-7"},
    )
    spec = job["spec"]
    assert job["metadata"]["name"] == "grid-1a2b3c4d-claude-7"
    assert job["metadata"]["namespace"] == "agents"
    assert spec["backoffLimit"] == 0  # gridd owns retries
    assert spec["activeDeadlineSeconds"] == 7200
    assert spec["ttlSecondsAfterFinished"] == 600
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False  # no API token in the box
    assert pod["serviceAccountName"] == "gridd-runner"
    assert pod["runtimeClassName"] == "gvisor"
    [box] = pod["containers"]
    assert box["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "500m", "memory": "1Gi"},
    }
    assert box["env"] == [
        {
            "name": "ANTHROPIC_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "anthropic", "key": "api-key"}},
        }
    ]
    labels = spec["template"]["metadata"]["labels"]
    assert labels["grid.workspace"] == "ab12" and labels["grid.run"] == "claude-7"
    assert labels["grid.task"].startswith("fix-login-")  # a label value, made valid
    assert labels["grid.box"] == job["metadata"]["name"]


def test_box_names_become_valid_object_names_without_collisions() -> None:
    assert k8s_name("grid-1a2b3c4d-claude-7") == "grid-1a2b3c4d-claude-7"
    odd = k8s_name("grid-1a2b3c4d-My_Profile-7")
    assert odd.startswith("grid-1a2b3c4d-my-profile-7-") and len(odd) <= 63
    assert odd != k8s_name("grid-1a2b3c4d-my-profile-7")
    assert len(k8s_name("grid-1a2b3c4d-" + "x" * 80)) <= 63


@pytest.mark.parametrize(
    ("job", "pods", "reason"),
    [
        (
            {"status": {}},
            [
                {
                    "metadata": {"name": "p"},
                    "status": {
                        "phase": "Failed",
                        "containerStatuses": [
                            {"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
                        ],
                    },
                }
            ],
            "oom_killed",
        ),
        (
            {"status": {"conditions": [{"type": "Failed", "reason": "DeadlineExceeded"}]}},
            [],
            "deadline_exceeded",
        ),
        (
            {"status": {}},
            [{"metadata": {"name": "p"}, "status": {"phase": "Failed", "reason": "Evicted"}}],
            "evicted",
        ),
        (
            {"status": {}},
            [
                {
                    "metadata": {"name": "p"},
                    "status": {
                        "conditions": [
                            {
                                "type": "DisruptionTarget",
                                "status": "True",
                                "reason": "DeletionByTaintManager",
                            }
                        ]
                    },
                }
            ],
            "node_lost",
        ),
        (None, [], "box_gone"),
    ],
)
def test_why_a_box_stopped_is_read_from_its_job_and_pod(
    job: dict[str, Any] | None, pods: list[dict[str, Any]], reason: str
) -> None:
    assert exit_reason(job, pods)[0] == reason


# -- the engine against the API ------------------------------------------------------------


def test_creating_a_taken_name_is_refused_so_a_run_never_has_two_copies(
    cluster: FakeCluster,
    engine: KubernetesEngine,
) -> None:
    labels = {"grid.workspace": "ab12", "grid.run": "r-1"}
    files = {"spec.json": b"{}"}
    # The bootstrap is given its files: a spec that cannot start fails the run in the
    # box, but the claim is what is looked at here.
    engine.create("grid-ab12-r-1", labels=labels, files=files)
    with pytest.raises(Conflict) as refused:
        engine.create("grid-ab12-r-1", labels=labels, files=files)
    assert refused.value.code == "box_exists"
    assert list(cluster.jobs()) == ["grid-ab12-r-1"]
    assert [b.name for b in engine.find({"grid.workspace": "ab12"})] == ["grid-ab12-r-1"]
    posts = [r for r in cluster.requests() if r[0] == "POST" and r[1].endswith("/jobs")]
    assert len(posts) == 2  # the second create reached the API server, which refused it
    engine.remove("grid-ab12-r-1")


def test_a_quota_denial_on_create_is_its_own_error(
    cluster: FakeCluster, engine: KubernetesEngine
) -> None:
    cluster.refuse_next_create(
        403,
        "Forbidden",
        'jobs.batch "grid-ab12-r-2" is forbidden: exceeded quota: grid-quota,'
        " requested: count/jobs.batch=1, used: count/jobs.batch=4, limited: count/jobs.batch=4",
    )
    with pytest.raises(GriddError) as refused:
        engine.create("grid-ab12-r-2", labels={"grid.run": "r-2"}, files={})
    assert refused.value.code == "quota_exceeded"
    assert "exceeded quota" in refused.value.message
    assert cluster.jobs() == {}


def test_a_job_whose_create_went_unanswered_is_deleted(
    cluster: FakeCluster, engine: KubernetesEngine
) -> None:
    """The API server made the Job but its answer was lost (a read timed out under load):
    the start fails, and the Job it may have made is deleted rather than left with a pod
    waiting for a run that is never put in."""
    cluster.lose_next_answer()
    with pytest.raises(BoxError) as failed:
        engine.create("grid-ab12-r-6", labels={"grid.run": "r-6"}, files={})
    assert "could not create the Job" in failed.value.message
    assert [r[0] for r in cluster.requests() if "/jobs" in r[1]] == ["POST", "DELETE"]
    assert cluster.jobs() == {} and cluster.pods() == {}


def test_an_exec_server_without_the_v5_protocol_is_refused_with_what_to_do(
    cluster: FakeCluster,
    engine: KubernetesEngine,
) -> None:
    cluster.only_v4()
    with pytest.raises(GriddError) as refused:
        engine.create("grid-ab12-r-3", labels={"grid.run": "r-3"}, files={})
    assert "v5.channel.k8s.io" in refused.value.message
    assert cluster.jobs() == {}  # the Job given up on is deleted


# -- whole runs ------------------------------------------------------------------------------


async def test_a_kubernetes_run_takes_answers_and_its_branch_comes_back(
    repo: Path, cluster: FakeCluster
) -> None:
    try:
        async with inprocess_daemon(
            repo, config(reader=agent_command("read_line.py")), executor=executor(repo, cluster)
        ) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "raw", "title": "read a line"})
            await first_line(
                grid, "ready for a line", what="the pod's agent's first line, mirrored"
            )
            [agent] = grid.state.agents.values()
            assert agent.executor is not None and agent.executor["kind"] == "kubernetes"
            [job] = cluster.jobs().values()
            assert job["metadata"]["labels"]["grid.run"] == agent.id
            assert job["metadata"]["labels"]["grid.task"] == "raw"
            [pod] = cluster.pods().values()
            spec_file = cluster.base / pod["metadata"]["name"] / "spec.json"
            assert spec_file.stat().st_mode & 0o077 == 0  # the run's user only
            spec = json.loads(spec_file.read_text())
            assert "PATH" not in spec["env"]  # none of the daemon's own environment
            assert spec["env"]["GRID_TASK_ID"] == "raw"
            grid.commands.respond(agent.id, "through the websocket")
            await until(lambda: grid.state.tasks["raw"].status == TaskStatus.REVIEW, what="review")
            assert git_show(repo, "grid/raw:answer.txt") == "through the websocket\n"
            run_dir = Path(agent.run_dir)
            assert (run_dir / "output.log").read_text() == "ready for a line\ngot a line\n"
            await until(lambda: cluster.jobs() == {}, what="the Job deleted")
            await until(lambda: cluster.pods() == {}, what="its pod collected with it")
    finally:
        kill_workspace_agents(repo)


async def test_where_a_kubernetes_run_executes_names_its_job_pod_and_node(
    repo: Path, cluster: FakeCluster
) -> None:
    """``/agents/{id}`` and ``gridctl agents`` name the executor, the Job (the box), its
    pod and the node the scheduler bound it to (``spec.nodeName``)."""
    try:
        async with inprocess_daemon(
            repo, config(reader=agent_command("read_line.py")), executor=executor(repo, cluster)
        ) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "where", "title": "read a line"})
            await first_line(grid, "ready for a line", what="the pod's agent's first line")
            [agent] = grid.state.agents.values()
            [pod] = cluster.pods().values()
            async with AsyncGridClient(daemon.sock) as c:
                shown = await c.get(f"/agents/{agent.id}")
            assert shown["executor"] == {
                "kind": "kubernetes",
                "box": agent.executor["box"],  # type: ignore[index]
                "pod": pod["metadata"]["name"],
                "node": NODE,
            }
            console = Console(width=300, record=True, highlight=False)
            console.print(agents_table([grid.state.agents[agent.id]]))
            assert f"pod {pod['metadata']['name']} on {NODE}" in console.export_text()
            grid.commands.respond(agent.id, "done")
            await until(
                lambda: grid.state.tasks["where"].status == TaskStatus.REVIEW, what="review"
            )
    finally:
        kill_workspace_agents(repo)


async def test_runs_wait_for_their_pods_through_one_watch_on_the_workspace(
    repo: Path, cluster: FakeCluster
) -> None:
    """Two runs start through one watch on the workspace's pods (kmock serves watches; the
    stand-in kubelet's writes go to them): no run lists its pod while it starts."""
    try:
        async with inprocess_daemon(
            repo, config(reader=agent_command("read_line.py")), executor=executor(repo, cluster)
        ) as daemon:
            grid: Grid = daemon.grid
            start_two_tasks(grid, max_agents=1)
            for task in ("one", "two"):
                await until(
                    lambda task=task: any(  # type: ignore[misc]
                        a.task_id == task and a.last_output == "ready for a line"
                        for a in grid.state.agents.values()
                    ),
                    what=f"{task}'s pod's agent's first line",
                )
                [agent] = [a for a in grid.state.agents.values() if a.task_id == task]
                grid.commands.respond(agent.id, "done")
                await until(
                    lambda task=task: grid.state.tasks[task].status == TaskStatus.REVIEW,  # type: ignore[misc]
                    what="review",
                )
            pods = [r for r in cluster.requests() if r[0] == "GET" and r[1].endswith("/pods")]
            watches = [r for r in pods if r[2].get("watch") in ("true", "1")]
            assert len(watches) == 1, pods
            assert watches[0][2].get("labelSelector", "").startswith("grid.workspace="), watches
            assert pods == watches  # no listing of a run's pod while it starts
    finally:
        kill_workspace_agents(repo)


async def test_two_kubernetes_runs_start_at_the_same_moment_in_one_daemon(
    repo: Path, cluster: FakeCluster
) -> None:
    """Two runs started together (``maxAgents: 2``): both pods run, both agents answer and
    both branches come back, with the daemon alive throughout (issue 25: a crash before)."""
    try:
        async with inprocess_daemon(
            repo, config(reader=agent_command("read_line.py")), executor=executor(repo, cluster)
        ) as daemon:
            grid: Grid = daemon.grid
            start_two_tasks(grid, max_agents=2)
            await until(
                lambda: (
                    sum(a.last_output == "ready for a line" for a in grid.state.agents.values())
                    == 2
                ),
                what="both pods' agents' first lines",
            )
            for agent in list(grid.state.agents.values()):
                grid.commands.respond(agent.id, f"answer for {agent.task_id}")
            await until(
                lambda: all(
                    grid.state.tasks[t].status == TaskStatus.REVIEW for t in ("one", "two")
                ),
                what="both in review",
            )
            for task in ("one", "two"):
                assert git_show(repo, f"grid/{task}:answer.txt") == f"answer for {task}\n"
    finally:
        kill_workspace_agents(repo)


async def test_a_restarted_daemon_finds_the_pod_by_label_and_its_output_stays_contiguous(
    repo: Path, tmp_path: Path, cluster: FakeCluster
) -> None:
    control = tmp_path / "control"
    control.mkdir()
    cfg = config(lines=agent_command("lines.py", str(control), "300"))
    try:
        async with inprocess_daemon(repo, cfg, executor=executor(repo, cluster)) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "burst", "title": "many lines"})
            await until(
                lambda: any(a.last_output == "burst ready" for a in grid.state.agents.values()),
                what="the agent ready",
            )
            [agent] = grid.state.agents.values()
            # Put in, and known to be: a restart keeps its Job whatever it finds of the run.
            assert (Path(agent.run_dir) / "remote.in").exists()
        # The daemon is gone; the pod is not. All of this is written meanwhile.
        (control / "go").touch()
        await until(lambda: (control / "burst.done").exists(), what="the burst written")
        (control / "end").touch()
        seen = len(cluster.requests())
        async with inprocess_daemon(repo, cfg, executor=executor(repo, cluster)) as daemon:
            grid = daemon.grid
            await until(
                lambda: grid.state.tasks["burst"].status == TaskStatus.REVIEW, what="review"
            )
            [again] = grid.state.agents.values()
            assert again.id == agent.id  # the same run: no second Job
        lines = (Path(agent.run_dir) / "output.log").read_text().splitlines()
        assert lines == ["burst ready"] + [f"burst line {n}" for n in range(1, 301)]
        after = cluster.requests()[seen:]
        assert not [r for r in after if r[0] == "POST"]  # nothing created again
        found = [r for r in after if r[1].endswith("/pods") and "labelSelector" in r[2]]
        assert found and found[0][2]["labelSelector"].startswith("grid.box=")
    finally:
        kill_workspace_agents(repo)


async def test_a_cancelled_kubernetes_run_deletes_its_job_with_its_pod(
    repo: Path, tmp_path: Path, cluster: FakeCluster
) -> None:
    cfg = config(hang=agent_command("hang.py", str(tmp_path)))
    try:
        async with inprocess_daemon(repo, cfg, executor=executor(repo, cluster)) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "stuck", "title": "never ends"})
            await until(lambda: (tmp_path / "stuck.pids").exists(), what="the hang agent")
            [agent] = grid.state.agents.values()
            await grid.commands.cancel_task("stuck")
            await until(lambda: not grid.state.live_agents(), what="the agent stopped")
            status = json.loads((Path(agent.run_dir) / "exit.json").read_text())
            assert status["exitCode"] != 0 or status["signal"] is not None
            await until(lambda: cluster.jobs() == {}, what="the Job deleted")
            deletes = [r for r in cluster.requests() if r[0] == "DELETE"]
            assert deletes and deletes[-1][2].get("propagationPolicy") == "Background"
            await until(lambda: cluster.pods() == {}, what="its pod collected")
    finally:
        kill_workspace_agents(repo)


OOM = {
    "phase": "Failed",
    "containerStatuses": [
        {"name": "box", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
    ],
}
EVICTED = {
    "phase": "Failed",
    "reason": "Evicted",
    "message": "The node was low on resource: memory.",
}


@pytest.mark.parametrize(
    ("how", "reason", "says"),
    [
        ("oom", "oom_killed", "out of memory"),
        ("evicted", "evicted", "low on resource"),
        ("deadline", "deadline_exceeded", "deadline exceeded"),
        ("deleted", "box_gone", "deleted outside gridd"),
    ],
)
async def test_a_pod_ended_by_the_cluster_fails_the_run_with_its_own_reason(
    repo: Path, tmp_path: Path, cluster: FakeCluster, how: str, reason: str, says: str
) -> None:
    cfg = config(hang=agent_command("hang.py", str(tmp_path)))
    try:
        async with inprocess_daemon(repo, cfg, executor=executor(repo, cluster)) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "stuck", "title": "ended by the cluster"})
            await until(lambda: (tmp_path / "stuck.pids").exists(), what="the hang agent")
            # Ended while it runs, as the daemon knows it (its spawn over): ended sooner,
            # it is a start that failed.
            await until(
                lambda: [a.pid for a in grid.state.agents.values()] != [None],
                what="the agent recorded running",
            )
            [first] = grid.state.agents.values()
            (tmp_path / "stuck.pids").unlink()
            [job] = cluster.jobs()
            if how == "oom":
                cluster.end_pod(job, OOM)
            elif how == "evicted":
                cluster.end_pod(job, EVICTED)
            elif how == "deadline":
                failed = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}
                cluster.set_job_status(job, {"conditions": [failed]})
                cluster.end_pod(job)  # the Job controller deletes its pods
            else:
                cluster.delete_job(job)
            await until(
                lambda: grid.state.agents[first.id].ended_at is not None, what="the run ended"
            )
            ended = grid.state.agents[first.id]
            assert ended.exit_reason == reason, (ended.error, ended.exit_code)
            assert ended.exit_code != 0 and ended.error and says in ended.error, ended.error
            # A failure like any other: retried by the usual rules, in a Job of its own.
            await until(lambda: (tmp_path / "stuck.pids").exists(), what="the retry running")
            assert len(grid.state.agents) == 2
            await until(lambda: events(grid, "agent.failed"), what="agent.failed recorded")
            assert events(grid, "agent.failed")[0]["exitReason"] == reason
    finally:
        kill_workspace_agents(repo)


async def test_a_quota_denial_is_not_started_yet_and_the_task_starts_once_it_is_free(
    repo: Path, cluster: FakeCluster
) -> None:
    cluster.refuse_next_create(
        403,
        "Forbidden",
        'jobs.batch "x" is forbidden: exceeded quota: grid-quota, requested: limits.memory=2Gi',
    )
    async with kube_daemon(repo, cluster) as grid:
        start_tasks(grid, {"id": "later", "title": "waits for the quota"})
        await first_line(grid, "ready for a line", what="the run started once the quota let it")
        await until(lambda: events(grid, "task.start_failed"), what="the refusal recorded")
        [refused] = events(grid, "task.start_failed")
        assert_not_started_yet(refused)
        assert_started_on_its_first_attempt(grid, "later")


async def test_a_profile_sets_its_own_image_and_resources_for_its_jobs(
    repo: Path, cluster: FakeCluster
) -> None:
    cfg = config(trivial=agent_command("trivial.py"))
    cfg["agents"]["trivial"]["kubernetes"] = {  # type: ignore[index]
        "image": "registry.example/big-box:2",
        "memory": "8Gi",
        "secret_env": {"OPENAI_API_KEY": "openai/key"},
    }
    try:
        async with inprocess_daemon(repo, cfg, executor=executor(repo, cluster)) as daemon:
            grid: Grid = daemon.grid
            start_tasks(grid, {"id": "big", "title": "in a bigger box"})
            await until(lambda: grid.state.tasks["big"].status == TaskStatus.REVIEW, what="review")
    finally:
        kill_workspace_agents(repo)
    [job] = cluster.created()
    [box] = job["spec"]["template"]["spec"]["containers"]
    assert box["image"] == "registry.example/big-box:2"
    assert box["resources"]["limits"] == {"cpu": "1", "memory": "8Gi"}  # cpu: the executor's
    assert [e["name"] for e in box["env"]] == ["OPENAI_API_KEY"]


#: Two threads' first decodes of lightkube's models at once, in a fresh interpreter, once
#: the engine has its client: a Job's manifest converted (``create``) and pods listed.
#: Threads switch as often as they can, so that the race shows in a few tries.
FIRST_DECODES = """
import sys, threading
sys.setswitchinterval(1e-6)
from lightkube import codecs
from lightkube.core import decoders
from lightkube.resources import core_v1
from gridd.runs.kubernetes import KubernetesEngine, job_manifest
from gridd.settings import KubernetesSettings
settings = KubernetesSettings(server=sys.argv[1], namespace="grid", image="x")
KubernetesEngine(settings).client()
job = job_manifest(settings, box="b", labels={"grid.run": "r"})
pods = b'{"items": [{"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}]}'
together = threading.Barrier(3)
def create():
    together.wait()
    codecs.from_dict(job)
def look():
    together.wait()
    decoders.decode_list(pods, core_v1.Pod)
threads = [threading.Thread(target=f) for f in (create, create, look)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("alive")
"""


def test_threads_decoding_lightkube_models_at_once_do_not_crash_the_process() -> None:
    """msgspec builds a model's type information at its first decode, and two threads doing
    that at once crashed the process (SIGSEGV, 7 tries in 8 before): the engine builds it
    once, on one thread, when it takes its client (no request made: no cluster needed)."""
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", FIRST_DECODES, "http://127.0.0.1:1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stdout) == (0, "alive\n"), done.stderr[-2000:]


def test_a_failing_exec_says_its_exit_code_from_the_error_channel(
    cluster: FakeCluster, engine: KubernetesEngine
) -> None:
    engine.create("grid-ab12-r-5", labels={"grid.run": "r-5"}, files={"spec.json": b"{}"})
    with pytest.raises(BoxError) as failed:
        engine.exec("grid-ab12-r-5", ["no-such-command"])
    assert "(2)" in failed.value.message and "unknown command" in failed.value.message
    engine.remove("grid-ab12-r-5")


def test_a_box_gone_carries_the_reason_the_cluster_gives(
    cluster: FakeCluster, engine: KubernetesEngine
) -> None:
    engine.create("grid-ab12-r-4", labels={"grid.run": "r-4"}, files={"spec.json": b"{}"})
    cluster.end_pod("grid-ab12-r-4", OOM)
    with pytest.raises(BoxGone) as gone:
        engine.exec("grid-ab12-r-4", ["poll", "0", "0", "10"])
    assert gone.value.reason == "oom_killed"
    engine.remove("grid-ab12-r-4")


# -- a cancel before the pod runs, a quota that refuses the pod ------------------------------


async def test_a_cancel_while_the_pod_is_pending_deletes_the_job_at_once(
    repo: Path, cluster: FakeCluster
) -> None:
    """The pod is never scheduled (kept Pending); the run's start would wait for it up to
    ``start_timeout_seconds`` (here 600 s). A cancel meanwhile deletes the Job with its pod
    at once and the run ends stopped, the task cancelled; the pod, released afterwards,
    cannot start anything: it went with its Job."""
    cluster.hold_pods()
    async with kube_daemon(repo, cluster, **PATIENT) as grid:
        start_tasks(grid, {"id": "parked", "title": "never scheduled"})
        await until(lambda: cluster.pods(), what="the Job's pod, Pending")
        [pod] = cluster.pods().values()
        assert pod["status"]["phase"] == "Pending"
        [agent] = grid.state.agents.values()
        await grid.commands.cancel_task("parked")
        # Well within the start's 600 s: no waiting for a timeout.
        await until(lambda: cluster.jobs() == {}, timeout=20, what="the Job deleted")
        deletes = [r for r in cluster.requests() if r[0] == "DELETE"]
        assert [d[2].get("propagationPolicy") for d in deletes] == ["Background"]
        await until(lambda: cluster.pods() == {}, timeout=20, what="its pod deleted")
        await until(
            lambda: grid.state.agents[agent.id].ended_at is not None,
            timeout=20,
            what="the run ended",
        )
        [stopped] = events(grid, "agent.stopped")
        assert stopped["agentId"] == agent.id
        assert stopped["reason"] == "cancelled by user"
        assert stopped["committedWork"] is False
        assert events(grid, "task.start_failed") == []
        assert events(grid, "agent.spawned") == []
        assert grid.state.tasks["parked"].status == TaskStatus.CANCELLED
        cluster.release_held()
        assert cluster.pods() == {} and cluster.jobs() == {}
        assert not list(cluster.base.glob("*/.ready"))  # no run was ever put in
        assert len([r for r in cluster.requests() if r[0] == "POST"]) == 1


def write_daemon_config(repo: Path, cfg: dict[str, Any], settings: KubernetesSettings) -> None:
    """``cfg`` (``config``) and ``settings`` as the workspace's config file, for a gridd
    process of its own."""
    lines = ["[scheduler]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in cfg["scheduler"].items()]
    lines += ["[executors]", 'default = "kubernetes"', "[executors.kubernetes]"]
    lines += [
        f"{k} = {toml_value(v)}" for k, v in settings.model_dump(exclude_defaults=True).items()
    ]
    for name, profile in cfg["agents"].items():
        lines += [f"[agents.{name}]", f"command = {toml_value(profile['command'])}"]
    write_config(repo, "\n".join(lines) + "\n")


async def test_a_job_never_given_its_run_by_a_killed_daemon_is_deleted_on_restart(
    repo: Path, cluster: FakeCluster
) -> None:
    """gridd is killed (-9) after creating the run's Job, while its pod is kept Pending:
    the run was never put in, and no daemon ever will put it in. The restarted daemon
    deletes that Job at once (not once the pod's bootstrap gives up, here 600 s), settles
    the agent as never started, and a cancel of its task is immediate."""
    cluster.hold_pods()
    cfg = config(reader=agent_command("read_line.py"))
    write_daemon_config(repo, cfg, k8s_settings(cluster, **PATIENT))
    daemon = start_daemon(repo)
    try:
        c = daemon.client()
        c.post("/tasks", {"id": "parked", "title": "never scheduled"})
        c.post("/session/start", {"maxAgents": 1})
        await until(lambda: cluster.pods(), what="the Job's pod, Pending")
        [agent] = c.get("/agents")
        daemon.kill9()
        [job] = cluster.jobs()
        run_dir = Path(agent["runDir"])
        assert (run_dir / "remote.json").exists() and not (run_dir / "remote.in").exists()
        seen = len(cluster.requests())
        async with kube_daemon(repo, cluster, cfg, **PATIENT) as grid:
            await until(
                lambda: [r for r in cluster.requests()[seen:] if r[0] == "DELETE"],
                timeout=20,
                what="the Job never given its run deleted",
            )
            [delete] = [r for r in cluster.requests()[seen:] if r[0] == "DELETE"]
            assert delete[1].endswith(f"/jobs/{job}")
            assert delete[2].get("propagationPolicy") == "Background"
            old = grid.state.agents[agent["id"]]
            assert old.ended_at is not None and old.pid is None
            [interrupted] = events(grid, "agent.spawn_interrupted")
            assert interrupted["agentId"] == agent["id"]
            await grid.commands.cancel_task("parked")
            # Well within the bootstrap's 600 s: no waiting for a timeout.
            await until(
                lambda: (
                    grid.state.tasks["parked"].status == TaskStatus.CANCELLED
                    and not grid.state.live_agents()
                ),
                timeout=20,
                what="the task cancelled, no agent left",
            )
            await until(lambda: cluster.jobs() == {}, timeout=20, what="every Job deleted")
            await until(lambda: cluster.pods() == {}, timeout=20, what="every pod deleted")
            assert events(grid, "agent.spawned") == []
            cluster.release_held()
            assert not list(cluster.base.glob("*/.ready"))  # no run was ever put in
    finally:
        if daemon.proc.poll() is None:
            daemon.kill9()
        kill_workspace_agents(repo)


QUOTA = (
    "exceeded quota: grid-quota, requested: limits.memory=2Gi, used: limits.memory=4Gi,"
    " limited: limits.memory=4Gi"
)


async def test_a_quota_that_refuses_the_pod_is_not_started_yet_and_the_job_goes(
    repo: Path, cluster: FakeCluster
) -> None:
    """The quota admits the Job but refuses its pod (the Job controller's ``FailedCreate``
    Event, no pod): not a start timeout but a quota refusal, read from the Job's Events
    long before ``start_timeout_seconds`` (600 s here); the Job is deleted (it would make
    the pod once the quota has room) and the task waits, no attempt spent, then starts."""
    cluster.refuse_pods_for_quota(QUOTA)
    async with kube_daemon(repo, cluster, **PATIENT) as grid:
        start_tasks(grid, {"id": "later", "title": "waits for the quota"})
        await until(lambda: events(grid, "task.start_failed"), what="the refusal recorded")
        cluster.refuse_pods_for_quota(None)
        [refused] = events(grid, "task.start_failed")[:1]
        assert_not_started_yet(refused)
        assert "pod" in str(refused["error"])
        lists = [r for r in cluster.requests() if r[1].endswith("/events")]
        assert lists and lists[0][2].get("fieldSelector", "").startswith(
            "involvedObject.name=grid-"
        ), lists
        first_job = cluster.created()[0]["metadata"]["name"]
        assert ("DELETE", first_job) in {
            (r[0], r[1].rsplit("/", 1)[-1]) for r in cluster.requests()
        }
        await first_line(grid, "ready for a line", what="the run started once the quota let it")
        assert_started_on_its_first_attempt(grid, "later")
        assert first_job not in cluster.jobs()


def test_a_quota_refusal_is_read_from_the_job_controllers_event() -> None:
    refused = {
        "involvedObject": {"kind": "Job", "name": "grid-ab12-r-1"},
        "reason": "FailedCreate",
        "message": f'Error creating: pods "grid-ab12-r-1-x" is forbidden: {QUOTA}',
    }
    other = {**refused, "involvedObject": {"kind": "Job", "name": "grid-ab12-r-2"}}
    no_node = {**refused, "reason": "FailedScheduling", "message": "0/3 nodes are available"}
    assert quota_refusal([no_node, other, refused], "grid-ab12-r-1") == refused["message"]
    assert quota_refusal([no_node, other], "grid-ab12-r-1") is None
