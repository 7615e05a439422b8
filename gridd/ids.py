"""Identifiers that become paths and branch names: validated before anything touches git.

A task id must match ``[a-z0-9][a-z0-9._-]{0,63}``, contain no ``..``, not end in ``.lock``
or ``.``, and ``grid/<id>`` must be a branch name ``git check-ref-format --branch`` accepts.
Within that alphabet the git rules reduce to the checks below (cross-checked against real
git in the tests), so validating 10,000 ids never forks 10,000 processes.
"""

from __future__ import annotations

import re
import secrets

from gridd.errors import ValidationFailed

#: Matched with ``fullmatch``: ``$`` alone would let a trailing newline through.
TASK_ID_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
BRANCH_PREFIX = "grid/"
#: Where work that was never a task's is kept (a run whose beads claim was lost).
KEPT_BRANCH_PREFIX = "grid-kept/"
_SLUG_RE = re.compile(r"[^a-z0-9]+")
# Feature branches are chosen by users and may contain slashes; keep them conservative.
FEATURE_BRANCH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")


def task_id_problem(task_id: str) -> str | None:
    """Why ``task_id`` is unacceptable, or None when it is fine."""
    if not isinstance(task_id, str) or not TASK_ID_RE.fullmatch(task_id):
        return "must match [a-z0-9][a-z0-9._-]{0,63}"
    if ".." in task_id:
        return "must not contain '..'"
    if task_id.endswith(".lock"):
        return "must not end in '.lock'"
    if task_id.endswith("."):
        return "must not end in '.'"
    return None


def validate_task_id(task_id: str) -> str:
    problem = task_id_problem(task_id)
    if problem is not None:
        raise ValidationFailed(
            f"invalid task id {task_id!r}: {problem}",
            code="invalid_task_id",
            details={"id": task_id, "problem": problem},
        )
    return task_id


def branch_problem(name: str) -> str | None:
    """Why a user-chosen branch name is unacceptable (git's check-ref-format rules)."""
    if name == "HEAD" or name.startswith("-"):
        return "HEAD and names starting with '-' are not branch names"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "must not contain control characters"
    if not FEATURE_BRANCH_RE.fullmatch(name):
        return "must start with a letter or digit and use only letters, digits, '.', '_', '-', '/'"
    for bad in ("..", "//", "@{", "/."):
        if bad in name:
            return f"must not contain {bad!r}"
    if name.endswith((".lock", ".", "/")) or ".lock/" in name:
        return "must not end in '.lock', '.' or '/'"
    return None


def new_task_id(title: str = "") -> str:
    """A fresh id: a slug of the title plus a random suffix (always valid)."""
    slug = _SLUG_RE.sub("-", title.lower()).strip("-")[:40].strip("-")
    suffix = secrets.token_hex(3)
    return f"{slug}-{suffix}" if slug else f"t-{suffix}"


def task_branch(task_id: str) -> str:
    return f"{BRANCH_PREFIX}{task_id}"


def kept_branch(task_id: str, agent_id: str) -> str:
    """The branch keeping what an agent did for a task that was never its own."""
    return f"{KEPT_BRANCH_PREFIX}{task_id}-{agent_id}"
