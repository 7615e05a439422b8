"""The podman executor's spawn against ``podman run`` of the same image alone (issue 25).

One real daemon serves a fresh repository whose default executor is ``podman`` (the cached
Debian image, ``runs/image.py``; the engine's own options: ``--runtime``, ``--ulimit``,
``--network=none``), running the trivial agent (``bench.harness.TRIVIAL_AGENT``: one file
written in its worktree, here the box's clone). Each spawn is timed from
``POST /tasks/{id}/start`` to that task's ``agent.spawned`` at an SSE client, as in
``bench_spawn``, and left to complete (the result branch fetched back, the container
removed: waited for) before the next.

Baseline, in the same run and taking turns with the spawns: ``podman run --rm`` of the same
image with the same options running ``python3 -c pass`` (what starting a container that runs
something costs on this machine, without gridd). Target: the spawn median <= 1.5 x the
baseline median. Single podman calls (``run -d``, ``exec``, ``rm``) are timed beside them, as
figures: what the spawn's steps cost here.

Skipped (no figures) where podman is missing, or its image cannot be built (no mmdebstrap,
not root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from bench.common import Check, RawHTTP, latency_baseline, median, ms_summary, result
from bench.harness import TRIVIAL_AGENT, EventTap, agent_daemon, api, of_task
from gridd.runs.boxes import BoxError
from gridd.runs.image import default_cache_dir, ensure_image
from gridd.runs.podman import PodmanEngine
from gridd.settings import PodmanSettings

NAME = "podman"
RUNS = 12
RUNS_QUICK = 4
TARGET_RATIO = 1.5


def _skipped(why: str, quick: bool) -> dict[str, Any]:
    return result(
        name=NAME,
        title=f"podman spawn against podman run: skipped, {why}",
        checks=[],
        baseline={},
        ratio=None,
        ratio_label="",
        figures={"skipped": why},
        quick=quick,
    )


def _timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


def _podman_calls(image: str, options: list[str], runs: int) -> dict[str, list[float]]:
    """Seconds of single podman calls on this machine: ``run -d`` of a container that
    sleeps, an ``exec`` of ``true`` in it, and its ``rm``."""
    calls: dict[str, list[float]] = {"run_d": [], "exec": [], "rm": []}
    for n in range(runs):
        name = f"gridd-bench-podman-{os.getpid()}-{n}"
        try:
            calls["run_d"].append(
                _timed(["podman", "run", "-d", f"--name={name}", *options, image, "sleep", "60"])
            )
            calls["exec"].append(_timed(["podman", "exec", name, "true"]))
        finally:
            calls["rm"].append(_timed(["podman", "rm", "--force", "--time=0", name]))
    return calls


def _until_removed(task: str, timeout: float = 30.0) -> None:
    """Until the task's container is gone (the mirror removes it after the run's end)."""
    deadline = time.monotonic() + timeout
    argv = ["podman", "ps", "--all", "--quiet", f"--filter=label=grid.task={task}"]
    while subprocess.run(argv, capture_output=True, check=True).stdout.strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the container of {task} was not removed in {timeout:g}s")
        time.sleep(0.05)


def _measure(image: str, options: list[str], runs: int) -> dict[str, list[float]]:
    alone = ["podman", "run", "--rm", *options, image, "python3", "-c", "pass"]
    times: dict[str, list[float]] = {"gridd": [], "podman_run": []}
    types = ["agent.spawned", "agent.completed", "agent.failed", "task.start_failed"]
    sections = {
        "executors": {"default": "podman"},
        "executors.podman": {"image": image, "look_seconds": 0.1},
    }
    with (
        agent_daemon(
            {"boxed": {"command": TRIVIAL_AGENT}}, default_agent="boxed", sections=sections
        ) as daemon,
        RawHTTP(daemon.sock, timeout=30) as http,
        EventTap(daemon.sock, types=types) as tap,
    ):
        tasks = [{"id": f"p{n}", "title": f"p{n}"} for n in range(runs + 1)]
        api(http, "POST", "/tasks", tasks)
        for n, task in enumerate(tasks):  # the first of each is a warm-up
            took = _timed(alone)
            started = time.monotonic()
            api(http, "POST", f"/tasks/{task['id']}/start")
            arrived, event = tap.expect(of_task(task["id"]), timeout=60)
            if event.type != "agent.spawned":
                raise RuntimeError(f"{task['id']}: {event.type} {event.data}")
            _, done = tap.expect(of_task(task["id"]), timeout=60)
            if done.type != "agent.completed":
                raise RuntimeError(f"{task['id']}: {done.type} {done.data}")
            _until_removed(task["id"])  # never timed against a removal still under way
            if n:
                times["podman_run"].append(took)
                times["gridd"].append(arrived - started)
    return times


def run(quick: bool) -> dict[str, Any]:
    runs = RUNS_QUICK if quick else RUNS
    if shutil.which("podman") is None:
        return _skipped("podman is not installed (apt-get install podman runc mmdebstrap)", quick)
    settings = PodmanSettings()
    try:
        image = ensure_image(
            settings.command,
            suite=settings.suite,
            packages=settings.packages,
            cache_dir=default_cache_dir(),
        )
    except (BoxError, OSError) as exc:
        return _skipped(f"the box image could not be built: {exc}", quick)
    options = PodmanEngine(settings, cache_dir=default_cache_dir()).run_options()
    load = os.getloadavg()[0]
    times = _measure(image, options, runs)
    calls = _podman_calls(image, options, max(3, runs // 2))
    gridd_ms = median(times["gridd"]) * 1000
    alone_ms = median(times["podman_run"]) * 1000
    ratio = gridd_ms / alone_ms
    return result(
        name=NAME,
        title="podman executor: start to agent.spawned against podman run of the same image",
        checks=[
            Check(
                metric=f"median spawn latency, podman executor ({runs} spawns)",
                value=round(gridd_ms, 2),
                unit="ms",
                target=f"<= {TARGET_RATIO:g} x podman run ({TARGET_RATIO * alone_ms:.1f} ms)",
                passed=ratio <= TARGET_RATIO,
            )
        ],
        baseline=latency_baseline(
            "podman run --rm of the same image and options, python3 -c pass", times["podman_run"]
        ),
        ratio=ratio,
        ratio_label="gridd spawn median / podman run median",
        figures={
            "runs": runs,
            "image": image,
            "options": options,
            "load_average_1m": round(load, 2),
            "gridd_spawn_ms": ms_summary(times["gridd"]),
            "podman_run_ms": ms_summary(times["podman_run"]),
            "podman_run_d_ms": ms_summary(calls["run_d"]),
            "podman_exec_ms": ms_summary(calls["exec"]),
            "podman_rm_ms": ms_summary(calls["rm"]),
            # The baseline waits for the container's exit and removal (--rm), which a spawn
            # does not: against the start alone (run -d, measured after the spawns).
            "spawn_over_run_detached": round(gridd_ms / (median(calls["run_d"]) * 1000), 2),
        },
        quick=quick,
        summary=f"spawn median {gridd_ms:.0f} ms, podman run {alone_ms:.0f} ms: ratio"
        f" {ratio:.2f} (load average {load:.1f}); podman run -d"
        f" {median(calls['run_d']) * 1000:.0f} ms, exec {median(calls['exec']) * 1000:.0f} ms",
        notes="a spawn and a podman run take turns; the first pair is a warm-up. The spawn"
        " includes the task's worktree, the bundle, the container's start, the clone in it"
        " and the agent's start, seen by the daemon",
    )
