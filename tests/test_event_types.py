"""The list of event types (``gridd.event_types``) is the one gridd publishes and documents,
and a type not on it is refused wherever a client or a config names one: by ``GET /events``,
by ``gridctl events`` and by ``[notifications] events``."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

import gridd
from gridd import event_types
from gridd.errors import ConfigError
from gridd.notify import NotificationRules
from gridd.settings import parse_settings
from tests.support.api import raw_http
from tests.support.cli import GRIDD, gridctl, run_gridd
from tests.support.daemons import running_daemon
from tests.support.repos import write_config
from tests.support.sse import read_sse

SOURCE = Path(gridd.__file__).resolve().parent
DOCS = SOURCE.parent / "docs" / "events.md"

#: The bus's own methods, and the supervisor's hook (``Supervisor.announce``, an attribute
#: the Grid sets, so no ``def`` of that name passes the type through).
BUS_METHODS = frozenset({"publish", "publish_many", "announce"})


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = fn.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def _callee(call: ast.Call) -> tuple[str, bool] | None:
    """``(name, on_self)`` of a call like ``x.y.name(...)`` / ``self.name(...)``."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    on_self = isinstance(func.value, ast.Name) and func.value.id == "self"
    return func.attr, on_self


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _calls_in(fn: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and n.args]


def published_types() -> tuple[set[str], list[str]]:
    """Every type gridd's source publishes, and each call whose type cannot be read.

    A publisher is a bus method, or a function that hands one of its own parameters to a
    publisher as the type (``Notifier._publish(type_, ...)``, ``Supervisor._tell(kind, ...)``):
    found here, not listed by hand. A wrapper called on ``self`` counts in its own module
    only (the radar's ``_publish(found)`` publishes no type of its caller's choosing)."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(SOURCE.rglob("*.py"))}
    anywhere: set[str] = set()  # wrappers called as ``obj.name(...)`` from any module
    local: dict[Path, set[str]] = {p: set() for p in trees}  # ... as ``self.name(...)``

    def is_publisher(path: Path, call: ast.Call) -> bool:
        callee = _callee(call)
        if callee is None:
            return False
        name, on_self = callee
        if name in BUS_METHODS:
            return True
        return name in local[path] if on_self else name in anywhere

    changed = True
    while changed:  # wrappers of wrappers
        changed = False
        for path, tree in trees.items():
            for fn in _functions(tree):
                params = _parameters(fn)
                for call in _calls_in(fn):
                    first = call.args[0]
                    passes_through = isinstance(first, ast.Name) and first.id in params
                    if passes_through and is_publisher(path, call) and fn.name not in local[path]:
                        local[path].add(fn.name)
                        anywhere.add(fn.name)
                        changed = True

    found: set[str] = set()
    unreadable: list[str] = []
    for path, tree in trees.items():
        wrappers = {fn: _parameters(fn) for fn in _functions(tree) if fn.name in local[path]}
        passed_on = {
            id(call)
            for fn, params in wrappers.items()
            for call in _calls_in(fn)
            if isinstance(call.args[0], ast.Name) and call.args[0].id in params
        }
        for call in _calls_in(tree):
            if not is_publisher(path, call) or id(call) in passed_on:
                continue
            first = call.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
            else:
                where = f"{path.relative_to(SOURCE.parent)}:{call.lineno}"
                unreadable.append(f"{where}: {ast.unparse(first)}")
    return found, unreadable


def documented_types() -> set[str]:
    """The first column of every table under docs/events.md's 'Event types'."""
    section = DOCS.read_text().split("## Event types", 1)[1]
    return set(re.findall(r"^\| `([a-z0-9_.-]+)` \|", section, flags=re.MULTILINE))


# -- the list cannot drift ------------------------------------------------------------------


def test_the_list_holds_exactly_the_types_the_source_publishes() -> None:
    found, unreadable = published_types()
    assert unreadable == [], "publish each event type as a string literal"
    assert len(found) > 40  # the scan really read the publishing code
    assert sorted(found - event_types.LOGGED) == [], "published but missing from the list"
    assert sorted(event_types.LOGGED - found) == [], "listed but never published"


def test_the_docs_table_lists_exactly_the_known_types() -> None:
    documented = documented_types()
    assert sorted(documented - event_types.ALL) == [], "documented but not in the list"
    assert sorted(event_types.ALL - documented) == [], "in the list but not documented"


@pytest.mark.parametrize("kind", sorted(event_types.DERIVED_NOTIFICATIONS))
def test_each_derived_notification_kind_is_one_the_notifier_derives(kind: str) -> None:
    # Derived from tasks.changed: the notifier listens to that, and to no type named kind.
    assert NotificationRules([kind]).types == {"tasks.changed"}


# -- GET /events ----------------------------------------------------------------------------


def _get(sock: Path, target: str) -> tuple[int, dict[str, object]]:
    status, _, body = raw_http(
        sock, f"GET {target} HTTP/1.1\r\nHost: gridd\r\nConnection: close\r\n\r\n".encode()
    )
    return status, json.loads(body) if status != 200 else {}


def test_events_refuse_an_unknown_type_naming_it_and_the_closest_known_one(repo: Path) -> None:
    with running_daemon(repo) as d:
        status, body = _get(d.sock, "/events?types=agent.completed,agent.questoin")
        assert status == 400
        error = body["error"]
        assert isinstance(error, dict)
        assert error["code"] == "unknown_event_type"
        assert error["message"] == (
            "unknown event type 'agent.questoin'; did you mean 'agent.question'?"
        )
        assert error["details"] == {
            "unknown": ["agent.questoin"],
            "known": sorted(event_types.ALL),
        }

        status, body = _get(d.sock, "/events?since=0&types=nosuch.type")
        assert status == 400
        error = body["error"]
        assert isinstance(error, dict)
        assert "'nosuch.type'" in str(error["message"])
        assert error["code"] == "unknown_event_type"


def test_events_still_stream_known_types_and_the_snapshot(repo: Path) -> None:
    with running_daemon(repo) as d:
        read = read_sse(
            d.sock,
            params={"types": "state.snapshot,reset,daemon.stopping"},
            until=lambda r: "state.snapshot" in r.types(),
        )
        assert read.types() == ["state.snapshot"]
        read = read_sse(
            d.sock,
            params={"since": "0", "types": "daemon.started"},
            until=lambda r: "daemon.started" in r.types(),
        )
        assert read.types() == ["daemon.started"]


# -- gridctl events -------------------------------------------------------------------------


@pytest.mark.parametrize("follow", [False, True], ids=["printed", "followed"])
def test_gridctl_events_with_a_misspelt_type_says_which_and_fails(repo: Path, follow: bool) -> None:
    with running_daemon(repo):
        args = ["events", "--types", "agent.spawned,agent.questoin"]
        proc = gridctl(repo, *args, *(["--follow"] if follow else []), timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines()[0] == (
        "gridctl: unknown event type 'agent.questoin'; did you mean 'agent.question'?"
        " [unknown_event_type]"
    )
    assert "Traceback" not in proc.stderr


# -- [notifications] events -----------------------------------------------------------------


def test_a_misspelt_notification_event_is_a_config_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"notifications": {"events": ["agent.questoin", "task.failed"]}})
    assert info.value.message == (
        "config: invalid value for 'notifications.events':"
        " unknown event 'agent.questoin'; did you mean 'agent.question'?"
    )
    assert info.value.details["problems"][0]["key"] == "notifications.events"


@pytest.mark.parametrize("name", ["notify.failed", "state.snapshot"])
def test_a_notification_event_that_can_never_notify_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"notifications": {"events": [name]}})
    assert f"'{name}' never notifies" in info.value.message


def test_every_event_and_derived_kind_the_notifier_can_send_is_accepted() -> None:
    names = sorted(event_types.NOTIFIABLE)
    assert {"task.failed", "tasks.all_done", "agent.question"} <= set(names)
    settings = parse_settings({"notifications": {"events": names}})
    assert settings.notifications.events == names


def test_gridd_check_config_and_start_refuse_a_misspelt_notification_event(repo: Path) -> None:
    write_config(repo, '[notifications]\nevents = ["agent.questoin"]\n')
    expected = "did you mean 'agent.question'?"
    check = subprocess.run(
        [*GRIDD, "--workspace", str(repo), "--check-config"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert check.returncode == 1
    assert "'notifications.events'" in check.stderr and expected in check.stderr
    start = run_gridd(repo)
    assert start.returncode == 1
    assert expected in start.stderr and "Traceback" not in start.stderr
    assert not (repo / ".grid" / "gridd.sock").exists()
