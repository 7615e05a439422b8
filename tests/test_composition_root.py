"""One composition root (issue 23): ``gridd/compose.py`` builds the daemon's object graph
through constructors and hands it to the ``Grid``; nothing is assigned onto a part after it
is built, and the environment is read by the root (``daemon.run``) and passed down.

import-linter holds who may import the root (pyproject.toml); these rules are about
assignments and reads, so they read the modules' syntax trees."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

GRIDD = Path(__file__).resolve().parent.parent / "gridd"

#: The daemon-side modules that read the process environment, and why each may.
ENVIRONMENT_READERS = {
    "daemon.py": "the root: reads it once and hands it down (agents, notifications, executors)",
    "workspace.py": "strips the GIT_* variables a hook exported, before the daemon uses git",
    "git/worktrees.py": "gridd's git runs with the daemon's environment, pinned to the repository",
    "runs/image.py": "the user's cache directory for a box's image (XDG_CACHE_HOME)",
    "runs/example.py": "the example agent: its own process",
    "runs/boxshim.py": "the shim inside a box: its own process",
}


def _tree(name: str) -> ast.Module:
    path = GRIDD / name
    return ast.parse(path.read_text(), filename=str(path))


def _foreign_assignments(tree: ast.AST, *, own: str | None) -> Iterator[str]:
    """Assignments onto an attribute of anything but ``own`` itself (``own.x = ...`` is
    construction; ``own.part.x = ...`` or ``part.x = ...`` is wiring after the fact)."""
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            if own is not None and isinstance(target.value, ast.Name) and target.value.id == own:
                continue
            yield f"line {node.lineno}: {ast.unparse(target)} = ..."


def test_the_composition_root_assigns_nothing_onto_the_parts_it_builds() -> None:
    assert list(_foreign_assignments(_tree("compose.py"), own=None)) == []


def test_the_grid_sets_only_its_own_attributes() -> None:
    assert list(_foreign_assignments(_tree("grid.py"), own="self")) == []


def test_the_environment_is_read_only_by_the_listed_modules() -> None:
    readers = set()
    for path in sorted(GRIDD.rglob("*.py")):
        name = path.relative_to(GRIDD).as_posix()
        if name in ("client.py", "demo.py") or name.startswith("cli/"):
            continue  # the client side runs in the user's shell, not in the daemon
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("environ", "getenv")
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                readers.add(name)
    assert readers <= set(ENVIRONMENT_READERS), sorted(readers - set(ENVIRONMENT_READERS))
    assert "grid.py" not in readers and "compose.py" not in readers


def test_the_scan_finds_wiring_after_the_fact() -> None:
    source = "grid.pool.on_exit = f\nself.commands.merge_answers = g\nself.x = 1\n"
    found = list(_foreign_assignments(ast.parse(source), own="self"))
    assert found == ["line 1: grid.pool.on_exit = ...", "line 2: self.commands.merge_answers = ..."]
