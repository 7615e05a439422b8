"""One owner per state machine, held by reading the source: a task's, an agent's or the
session's status is written only by ``gridd/lifecycle.py`` (with the state cache,
``gridd/state.py``, that it writes through), and the pool's tables change only through the
pool's methods.

import-linter checks imports, not writes, so these rules are a scan of every module's
syntax tree. Each rule names what it forbids and where it is allowed; a finding names the
file and line."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

GRIDD = Path(__file__).resolve().parent.parent / "gridd"

#: The owner of the task, agent and session state machines, and the cache it writes through.
OWNER = "lifecycle.py"
CACHE = "state.py"
#: The question's own state machine (open -> answered | closed) lives in its book.
QUESTIONS = "questions.py"

#: Fields that say which state a task, an agent or the session is in.
STATUS_FIELDS = frozenset({"status", "status_reason", "status_changed_at", "started"})
#: The models whose status the owner writes.
OWNED_MODELS = frozenset({"Task", "Agent", "SessionState"})
#: The state cache's raw writers: they take a status as given, so only the owner calls them.
RAW_WRITERS = frozenset(
    {"add_tasks", "add_tasks_yielding", "put_agent", "write_tasks", "write_agent", "set_session"}
)
#: The pool's tables (``pool/roster.py``): read through the pool, changed by its methods.
POOL_TABLES = frozenset(
    {"handles", "runs", "started_mono", "starting", "finishing", "not_before", "stops"}
)
MUTATORS = frozenset(
    {"add", "discard", "remove", "pop", "popitem", "clear", "update", "setdefault", "append"}
)


def _modules() -> Iterator[tuple[str, ast.AST]]:
    """The daemon side's modules (the client side holds no state: an error's ``.status``
    there is an HTTP status)."""
    for path in sorted(GRIDD.rglob("*.py")):
        name = path.relative_to(GRIDD).as_posix()
        if name in ("client.py", "demo.py") or name.startswith("cli/"):
            continue
        yield name, ast.parse(path.read_text(), filename=str(path))


def _keys(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        return {
            k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    return set()


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _status_writes(name: str, tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in STATUS_FIELDS:
                    yield f"{name}:{node.lineno}: assigns .{target.attr}"
                if isinstance(target, ast.Subscript) and _is_dict_of_model(target.value):
                    yield f"{name}:{node.lineno}: writes a model's __dict__"
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            yield f"{name}:{node.lineno}: reaches into a model's __dict__"
        if not isinstance(node, ast.Call):
            continue
        callee = _callee(node)
        if callee in OWNED_MODELS:
            for kw in node.keywords:
                if kw.arg in STATUS_FIELDS:
                    yield f"{name}:{node.lineno}: builds a {callee} with {kw.arg}="
        if callee == "model_copy":
            for kw in node.keywords:
                fields = _keys(kw.value) & STATUS_FIELDS if kw.arg == "update" else set()
                if fields and name != QUESTIONS:
                    yield f"{name}:{node.lineno}: model_copy(update=...) sets {sorted(fields)}"
        if callee in ("validated_task", "validated_agent", "validated_session", "model_validate"):
            for arg in node.args[1:] if callee != "model_validate" else node.args:
                fields = _keys(arg) & STATUS_FIELDS
                if fields:
                    yield f"{name}:{node.lineno}: {callee} with {sorted(fields)}"


def _is_dict_of_model(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "__dict__"


def _raw_writes(name: str, tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in RAW_WRITERS
        ):
            yield f"{name}:{node.lineno}: calls the state's raw writer {node.func.attr}()"


def _pool_table_writes(name: str, tree: ast.AST) -> Iterator[str]:
    """``pool.<table>.add(...)``, ``pool.<table>[k] = v``, ``del pool.<table>[k]``."""

    def pool_table(node: ast.AST) -> str | None:
        if (
            isinstance(node, ast.Attribute)
            and node.attr in POOL_TABLES
            and isinstance(node.value, ast.Attribute | ast.Name)
            and (node.value.attr if isinstance(node.value, ast.Attribute) else node.value.id)
            == "pool"
        ):
            return node.attr
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            table = pool_table(node.func.value)
            if table is not None and node.func.attr in MUTATORS:
                yield f"{name}:{node.lineno}: pool.{table}.{node.func.attr}()"
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            inner = target.value if isinstance(target, ast.Subscript) else target
            table = pool_table(inner)
            if table is not None:
                yield f"{name}:{node.lineno}: writes pool.{table}"


@pytest.fixture(scope="module")
def modules() -> list[tuple[str, ast.AST]]:
    found = list(_modules())
    assert any(name == OWNER for name, _ in found)
    return found


def test_only_lifecycle_writes_a_task_agent_or_session_status(
    modules: list[tuple[str, ast.AST]],
) -> None:
    found = [w for name, tree in modules if name != OWNER for w in _status_writes(name, tree)]
    assert found == []


def test_only_lifecycle_calls_the_state_caches_raw_writers(
    modules: list[tuple[str, ast.AST]],
) -> None:
    found = [
        w for name, tree in modules if name not in (OWNER, CACHE) for w in _raw_writes(name, tree)
    ]
    assert found == []


def test_the_pools_tables_change_only_through_the_pools_methods(
    modules: list[tuple[str, ast.AST]],
) -> None:
    found = [w for name, tree in modules for w in _pool_table_writes(name, tree)]
    assert found == []


def test_the_scan_finds_each_kind_of_write() -> None:
    """The rules above catch what they claim to (a rule that finds nothing proves nothing)."""
    source = (
        "task.status = 'done'\n"
        "agent.__dict__['output_seq'] = 1\n"
        "Task(id='t', title='t', status=TaskStatus.READY)\n"
        "session.model_copy(update={'started': False})\n"
        "validated_task(task, {'status': 'done'})\n"
        "state.put_agent(agent)\n"
        "self.pool.not_before.pop(task_id, None)\n"
        "self.pool.starting.add(task_id)\n"
        "grid.pool.stops['a1'] = True\n"
    )
    tree = ast.parse(source)
    assert {_line(w) for w in _status_writes("x.py", tree)} == {1, 2, 3, 4, 5}
    assert {_line(w) for w in _raw_writes("x.py", tree)} == {6}
    assert {_line(w) for w in _pool_table_writes("x.py", tree)} == {7, 8, 9}


def _line(finding: str) -> int:
    return int(finding.split(":")[1])
