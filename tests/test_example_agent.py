"""The bundled example agent commits only when gridd started it.

Run by hand in any checkout (``python -m gridd.runs.example --help`` was the first thing a
new user tried), it used to take ``--help`` for a prompt and commit into that repository.
Now ``--help`` prints its usage and anything else without gridd's ``GRID_TASK_ID`` is refused
with exit status 2; the repository is left exactly as it was. Started as gridd starts it,
it still writes, commits and leaves a file for gridd to commit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.git import git


def _run(repo: Path, *args: str, **grid_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    return subprocess.run(
        [sys.executable, "-m", "gridd.runs.example", *args],
        cwd=repo,
        env={**env, "GRID_EXAMPLE_DELAY": "0", **grid_env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _snapshot(repo: Path) -> tuple[str, str, list[str]]:
    """HEAD, the status and every file: what the agent must not change."""
    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if ".git" not in p.parts)
    return git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain", "--ignored"), files


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_example_agent_help_prints_usage_and_changes_nothing(repo: Path, flag: str) -> None:
    before = _snapshot(repo)
    result = _run(repo, flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m gridd.runs.example PROMPT\n")
    assert result.stderr == ""
    assert _snapshot(repo) == before


def test_example_agent_run_by_hand_refuses_in_one_line_and_changes_nothing(repo: Path) -> None:
    before = _snapshot(repo)
    result = _run(repo, "write the parser")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "gridd's example agent" in result.stderr
    assert "GRID_TASK_ID" in result.stderr
    assert _snapshot(repo) == before


def test_example_agent_started_as_gridd_starts_it_commits_its_notes(repo: Path) -> None:
    result = _run(repo, "write the parser", GRID_TASK_ID="parser")
    assert result.returncode == 0, result.stderr
    assert "[example:parser] committed notes" in result.stdout
    log = subprocess.run(
        ["git", "-C", str(repo), "log", "-1", "--format=%s"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert log.stdout == "parser: notes\n"
    assert "write the parser" in (repo / "notes" / "parser.md").read_text()
    assert (repo / "src" / "parser.py").exists()  # left for gridd to commit
