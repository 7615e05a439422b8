"""Task ids become paths and branch names: hostile ones are refused everywhere, with a 422."""

from __future__ import annotations

import random
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from gridd.errors import ValidationFailed
from gridd.ids import new_task_id, task_branch, task_id_problem, validate_task_id
from tests.support.daemons import DaemonProc

HOSTILE_IDS = [
    "",
    "../x",
    "..",
    "a..b",
    "x/../../etc",
    "-x",
    "--force",
    "x.lock",
    "x.",
    ".x",
    "_x",
    "A",
    "Task",
    "a" * 65,
    "with space",
    " leading",
    "trailing ",
    "a/b",
    "a\\b",
    "tab\tid",
    "new\nline",
    "trailing-newline\n",  # a regex ending in $ lets this through unless it must match whole
    "nul\x00",
    "caf\u00e9",
    "\u0430bc",  # Cyrillic a
    "emoji\U0001f600",
    "a@{1}",
    "a~1",
    "a^2",
    "a:b",
    "a?",
    "a*",
    "a[b",
    "@",
    "HEAD",
]


def git_accepts_branch(name: str) -> bool:
    proc = subprocess.run(
        ["git", "check-ref-format", "--branch", name],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


@pytest.mark.parametrize("task_id", HOSTILE_IDS, ids=repr)
def test_hostile_task_ids_are_refused_by_the_validator(task_id: str) -> None:
    assert task_id_problem(task_id) is not None
    with pytest.raises(ValidationFailed) as info:
        validate_task_id(task_id)
    assert info.value.code == "invalid_task_id"


@pytest.mark.parametrize("task_id", ["a", "0", "a-b_c.d", "x" * 64, "v1.2.3", "a--b", "t-00"])
def test_ordinary_task_ids_are_accepted(task_id: str) -> None:
    assert task_id_problem(task_id) is None
    assert git_accepts_branch(task_branch(task_id))


def test_a_64_character_id_is_accepted_and_65_refused() -> None:
    assert task_id_problem("a" * 64) is None
    assert task_id_problem("a" * 65) is not None


def test_generated_ids_are_always_valid() -> None:
    titles = ["", "Fix the LOGIN page!", "..", "-x-", "é" * 80, "a" * 200, "a.lock", "x/y"]
    for title in titles:
        for _ in range(20):
            generated = new_task_id(title)
            assert task_id_problem(generated) is None, (title, generated)


def _candidate(rng: random.Random) -> str:
    """Random strings biased towards the accepted alphabet and git's edge cases."""
    pieces = [
        *"abcdefghijklmnopqrstuvwxyz0123456789",
        *"..--__",
        ".lock",
        "..",
        "@{",
        "/",
        "A",
        " ",
        "~",
        "^",
        ":",
        "\\",
        "\u00e9",
        "*",
        "?",
        "[",
        "\x7f",
    ]
    weights = [12] * 36 + [6] * 6 + [2] * (len(pieces) - 42)
    size = rng.choice([1, 2, 3, 5, 8, 13, 30, 60, 64, 65, 70])
    return "".join(rng.choices(pieces, weights=weights, k=size))[: rng.randint(1, 70)]


def test_every_id_the_validator_accepts_is_a_branch_git_accepts() -> None:
    rng = random.Random(20261122)
    candidates = {_candidate(rng) for _ in range(6000)}
    candidates |= {f"a{end}" for end in (".", ".lock", "..", "-", "_", ".l0ck", ".lock.a")}
    accepted = sorted(c for c in candidates if task_id_problem(c) is None)
    refused = len(candidates) - len(accepted)
    assert len(accepted) > 300 and refused > 300  # both sides are really exercised
    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = pool.map(lambda c: git_accepts_branch(task_branch(c)), accepted)
        rejected_by_git = [c for c, ok in zip(accepted, verdicts, strict=True) if not ok]
    assert rejected_by_git == []


def test_the_api_refuses_hostile_task_ids_with_a_json_422(daemon: DaemonProc) -> None:
    c = daemon.client()
    c.post("/tasks", {"id": "ok", "title": "a task that exists"})
    before = c.get("/tasks")
    for task_id in HOSTILE_IDS:
        response = c._http.post("/tasks", json={"id": task_id, "title": "hostile"})
        assert response.status_code == 422, (task_id, response.text)
        error = response.json()["error"]
        assert error["code"] == "validation_failed", task_id
        assert "invalid task id" in error["message"], task_id
        # As a dependency, in a list, in a plan: the same.
        response = c._http.post("/tasks", json=[{"title": "t", "dependsOn": [task_id]}])
        assert response.status_code == 422, (task_id, response.text)
        assert "invalid dependency id" in response.json()["error"]["message"]
        response = c._http.post("/plans", json={"tasks": [{"id": task_id, "title": "t"}]})
        assert response.status_code == 422, (task_id, response.text)
    assert c.get("/tasks") == before


def test_hostile_ids_in_a_path_are_refused_not_looked_up(daemon: DaemonProc) -> None:
    c = daemon.client()
    for task_id in ["A", "-x", "x.lock", "a" * 65, "caf\u00e9", "with space", "a..b", "x."]:
        for method, suffix in (("GET", ""), ("POST", "/start"), ("DELETE", "")):
            response = c._http.request(method, f"/tasks/{task_id}{suffix}")
            assert response.status_code == 422, (method, task_id, response.text)
            assert response.json()["error"]["code"] == "invalid_task_id"
    # Percent-encoded slashes and dots never reach a handler as a task id: each is refused
    # as the id it spells, whichever route it would otherwise have been decoded into.
    for method, raw in (
        ("GET", "/tasks/..%2Fx"),
        ("GET", "/tasks/%2E%2E"),
        ("POST", "/tasks/a%2Fb/start"),
        ("POST", "/tasks/a%2Fstart"),
    ):
        response = c._http.request(method, raw)
        assert response.status_code == 422, (method, raw, response.text)
        assert response.json()["error"]["code"] == "invalid_task_id", (method, raw)
