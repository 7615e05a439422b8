"""Driving each real agent CLI: gridd's overhead over running it by hand.

Per CLI installed for the real-CLI tests (``tests/tools/agent-clis.txt``; one not installed
is skipped and said so), against the same loopback stand-in of its provider's API
(``tests/anthropic_standin.py`` for Claude Code and opencode, ``openai_standin.py`` for
Codex, ``gemini_standin.py`` for Gemini CLI), with the profile the real-CLI tests use
(``tests/real_cli.py``): the model runs one shell command writing a file, then says "Done."

gridd: a real daemon, a session started; per run, ``POST /tasks`` until a raw SSE reader sees
the task's ``agent.completed`` (its worktree made, the CLI spawned through the shim and
read, the work committed, the task in review). Baseline (same run): this process does the
least any supervisor must: ``git worktree add -b``, the same CLI with the same argv and
environment (``Popen``; Claude's prompt on stdin, which is closed on its ``result``),
waiting for its exit, ``git add -A`` + ``git commit``. One baseline run first warms the
disk cache and the CLI's own state (unmeasured); then the two take turns going first.

3 runs per CLI (1 with ``--quick``), medians. Target (issue 27): gridd / baseline <= 1.5
for each CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.baselines import GIT_IDENTITY, git_env
from bench.common import Check, RawHTTP, make_repo, median, remove_repo, result
from bench.harness import EventTap, agent_daemon, api, request
from gridd.adapters.registry import get_adapter
from tests import anthropic_standin, gemini_standin, openai_standin
from tests.real_cli import (
    claude_profile,
    codex_home,
    codex_profile,
    gemini_profile,
    installed_version,
    opencode_profile,
)
from tests.standin import Reply, ScriptedAPI

NAME = "agent_clis"
RUNS = 3
RUNS_QUICK = 1
TARGET_RATIO = 1.5
CLIS = ("claude", "codex", "gemini", "opencode")
COMMAND = "echo written > written.txt"
PROMPT = "write the file"


@dataclass
class Setup:
    """A CLI against its stand-in: the profile, and the model's script for one run."""

    api: ScriptedAPI[Any]
    profile: dict[str, Any]
    script: Callable[[], list[Reply]]


@contextlib.contextmanager
def cli_setup(cli: str, home: Path) -> Iterator[Setup]:
    """The stand-in of ``cli``'s provider, running, and the profile that drives it."""
    if cli in ("claude", "opencode"):
        with anthropic_standin.standin() as claude_api:
            if cli == "claude":
                profile = claude_profile(claude_api.url, home, allowed_tools=["Bash"])
                tool = anthropic_standin.tool("Bash", {"command": COMMAND, "description": "write"})
            else:
                profile = opencode_profile(claude_api.url, home)
                tool = anthropic_standin.tool("bash", {"command": COMMAND, "description": "write"})
            yield Setup(claude_api, profile, lambda: [tool])
    elif cli == "codex":
        with (
            openai_standin.standin() as codex_api,
            codex_home(codex_api.url, openai_standin.MODEL) as codex_dir,
        ):
            call = openai_standin.call("exec_command", {"cmd": COMMAND})
            yield Setup(codex_api, codex_profile(codex_dir, openai_standin.MODEL), lambda: [call])
    else:
        with gemini_standin.standin() as gemini_api:
            profile = gemini_profile(gemini_api.url, home, gemini_standin.MODEL)
            shell = gemini_standin.call("run_shell_command", {"command": COMMAND})
            yield Setup(gemini_api, profile, lambda: [shell])


def _argv(profile: dict[str, Any], worktree: Path) -> list[str]:
    """The command gridd runs for this profile: placeholders filled, the adapter's extras."""
    argv = [
        str(a).replace("{prompt}", PROMPT).replace("{worktree}", str(worktree))
        for a in profile["command"]
    ]
    adapter = get_adapter(profile["adapter"], options=profile.get("adapter_options"))
    return argv + adapter.extra_args(argv)


def _baseline_run(setup: Setup, root: Path, n: int) -> float:
    env = git_env()
    tree = root.parent / f"{root.name}-wt{n}"
    setup.api.push(*setup.script())
    profile = setup.profile
    started = time.monotonic()
    subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "-q", "-b", f"b{n}", "--", str(tree)],
        check=True,
        env=env,
    )
    claude = profile["adapter"] == "claude"
    proc = subprocess.Popen(
        _argv(profile, tree),
        cwd=tree,
        stdin=subprocess.PIPE if claude else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **profile.get("env", {})},
        text=True,
    )
    assert proc.stdout is not None
    if claude:
        assert proc.stdin is not None
        prompt = {"type": "user", "message": {"role": "user", "content": PROMPT}}
        proc.stdin.write(json.dumps(prompt) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith("{") and json.loads(line).get("type") == "result":
                proc.stdin.close()
                break
    proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError(f"{profile['adapter']} exited {proc.returncode} in the baseline")
    subprocess.run(["git", "-C", str(tree), "add", "-A"], check=True, env=env)
    subprocess.run(
        ["git", *GIT_IDENTITY, "-C", str(tree), "commit", "-q", "-m", "bench"],
        check=True,
        env=env,
    )
    elapsed = time.monotonic() - started
    if not (tree / "written.txt").exists():
        raise RuntimeError(f"{profile['adapter']} wrote nothing in the baseline")
    return elapsed


def _gridd_run(setup: Setup, sock: Path, tap: EventTap, task: str) -> float:
    setup.api.push(*setup.script())
    # A connection of its own: a baseline run outlasts the keep-alive timeout.
    with RawHTTP(sock) as http:
        started = time.monotonic()
        api(http, "POST", "/tasks", {"id": task, "title": task, "prompt": PROMPT})
        # The session ends when its tasks are done: start it (409 task_working if the
        # running session has started it already: fine).
        request(http, "POST", f"/tasks/{task}/start")
    arrived, event = tap.expect(lambda e: e.data.get("taskId") == task, timeout=180)
    if event.type != "agent.completed":
        raise RuntimeError(f"{task} under gridd: {event.type} {event.data}")
    return arrived - started


def _measure(cli: str, runs: int) -> tuple[list[float], list[float]]:
    """(gridd's seconds per run, the baseline's), alternating."""
    wall: list[float] = []
    base: list[float] = []
    home = Path(tempfile.mkdtemp(prefix="gridd-bench-home-"))
    root = make_repo()
    try:
        with (
            cli_setup(cli, home) as setup,
            agent_daemon({cli: setup.profile}, default_agent=cli) as daemon,
            EventTap(daemon.sock, types=["agent.completed", "agent.failed"]) as tap,
        ):
            with RawHTTP(daemon.sock) as http:
                api(http, "POST", "/session/start", {"featureBranch": "feature/bench"})
            _baseline_run(setup, root, runs)  # the warm-up
            for n in range(runs):
                if n % 2 == 0:
                    base.append(_baseline_run(setup, root, n))
                wall.append(_gridd_run(setup, daemon.sock, tap, f"{cli}{n}"))
                if n % 2 == 1:
                    base.append(_baseline_run(setup, root, n))
    finally:
        remove_repo(root)
        for extra in root.parent.glob(f"{root.name}-wt*"):
            shutil.rmtree(extra, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    return wall, base


def run(quick: bool) -> dict[str, Any]:
    runs = RUNS_QUICK if quick else RUNS
    checks: list[Check] = []
    figures: dict[str, Any] = {"runs": runs}
    said: list[str] = []
    ratios: list[float] = []
    for cli in CLIS:
        version = installed_version(cli)
        if version is None:
            figures[cli] = "not installed (make agent-clis)"
            said.append(f"{cli}: not installed")
            continue
        wall, base = _measure(cli, runs)
        ratio = median(wall) / median(base)
        ratios.append(ratio)
        checks.append(
            Check(
                metric=f"{cli} {version}: task to review / by hand (median)",
                value=round(ratio, 3),
                unit="x",
                target=f"<= {TARGET_RATIO} x",
                passed=ratio <= TARGET_RATIO,
            )
        )
        figures[cli] = {
            "version": version,
            "gridd_s": [round(v, 3) for v in wall],
            "baseline_s": [round(v, 3) for v in base],
            "ratio": round(ratio, 3),
        }
        said.append(f"{cli} {median(wall):.2f} s / {median(base):.2f} s = {ratio:.2f}x")
    return result(
        name=NAME,
        title="agent CLIs: task to review through gridd / the CLI run by hand",
        checks=checks,
        baseline={
            "what": "worktree add, the same CLI and argv by Popen, git add + commit (no gridd)",
            "value": None,
            "unit": "s",
        },
        ratio=max(ratios) if ratios else None,
        ratio_label="gridd / baseline (worst CLI)",
        figures=figures,
        quick=quick,
        summary="; ".join(said),
    )
