"""The kubernetes executor against a real cluster: a whole run (its Job scheduled, the image
pulled, the in-box shim, an answer in, the result branch out and merged) and a cancel, with a
real ``gridd`` process. Run only when a cluster is given; skipped otherwise, with the reason:

    GRIDD_TEST_KUBECONFIG=~/.kube/config        (or KUBECONFIG)
    GRIDD_TEST_KUBE_IMAGE=registry.example/gridd-box:1   (built from contrib/kubernetes/Dockerfile)
    GRIDD_TEST_KUBE_NAMESPACE=gridd-agents      (default: gridd-agents; the RBAC of
                                                  contrib/kubernetes/rbac.yaml bound in it)

The agents are inline ``python3 -c`` programs, so the image needs nothing but what the
Dockerfile puts in. tests/test_kubernetes_runs.py tests the same executor against the
stand-in cluster on every run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gridd.client import GridClient
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.repos import write_config
from tests.support.waits import wait_for

KUBECONFIG = os.environ.get("GRIDD_TEST_KUBECONFIG") or os.environ.get("KUBECONFIG", "")
IMAGE = os.environ.get("GRIDD_TEST_KUBE_IMAGE", "")
NAMESPACE = os.environ.get("GRIDD_TEST_KUBE_NAMESPACE", "gridd-agents")

pytestmark = [
    pytest.mark.xdist_group("kubernetes-cluster"),
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (KUBECONFIG and IMAGE),
        reason="no cluster given: set KUBECONFIG (or GRIDD_TEST_KUBECONFIG) and"
        " GRIDD_TEST_KUBE_IMAGE (an image built from contrib/kubernetes/Dockerfile, pushed"
        " where the cluster pulls from) to run the kubernetes executor against a real cluster",
    ),
]

READER = (
    "import sys; print('ready for a line', flush=True); line = sys.stdin.readline();"
    " open('answer.txt', 'w').write(line); print('got a line', flush=True)"
)
HANG = "import time; print('hanging', flush=True); time.sleep(3600)"


def cluster_config(root: Path, **profiles: str) -> None:
    lines = [
        "[scheduler]",
        f'default_agent = "{next(iter(profiles))}"',
        "tick_seconds = 0.5",
        "max_attempts = 1",
        "[executors]",
        'default = "kubernetes"',
        "[executors.kubernetes]",
        f"kubeconfig = {json.dumps(os.path.expanduser(KUBECONFIG))}",
        f"namespace = {json.dumps(NAMESPACE)}",
        f"image = {json.dumps(IMAGE)}",
        "start_timeout_seconds = 300",
    ]
    for name, program in profiles.items():
        lines += [f"[agents.{name}]", f"command = {json.dumps(['python3', '-c', program])}"]
    write_config(root, "\n".join(lines) + "\n")


def start(c: GridClient, task: str) -> None:
    c.post("/tasks", {"id": task, "title": task})
    c.post("/session/start", {"featureBranch": "feature/cluster"})


def test_a_run_on_a_real_cluster_takes_an_answer_and_its_branch_is_merged(repo: Path) -> None:
    cluster_config(repo, reader=READER)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "incluster")
        agent = wait_for(
            lambda: next(
                (a for a in c.get("/agents") if a["lastOutput"] == "ready for a line"), None
            ),
            timeout=360,
            message="the pod's agent's first line (scheduled, image pulled, run put in)",
        )
        where = c.get(f"/agents/{agent['id']}")["executor"]
        assert where["kind"] == "kubernetes" and where["pod"] and where["node"], where
        c.post(f"/agents/{agent['id']}/respond", {"response": "from the host"})
        wait_task_status(c, "incluster", "review", timeout=120)
        assert git_show(repo, "grid/incluster:answer.txt") == "from the host\n"
        c.post("/tasks/incluster/approve")
        wait_task_status(c, "incluster", "done", timeout=120)
        assert git_show(repo, "feature/cluster:answer.txt") == "from the host\n"
        assert (Path(agent["runDir"]) / "output.log").read_text() == (
            "ready for a line\ngot a line\n"
        )


def test_a_cancelled_run_on_a_real_cluster_stops(repo: Path) -> None:
    cluster_config(repo, hang=HANG)
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start(c, "stuck")
        wait_for(
            lambda: any(a["lastOutput"] == "hanging" for a in c.get("/agents")),
            timeout=360,
            message="the pod's agent running",
        )
        c.request("DELETE", "/tasks/stuck")
        wait_for(lambda: not c.get("/agents"), timeout=120, message="the agent stopped")
        [agent] = c.get("/agents", params={"all": "1"})
        assert agent["exitCode"] != 0
