"""``gridctl daemon upgrade``: replace a running gridd with the installed one, agents kept.

Nothing is stopped until the new version has said yes twice:

1. ``gridd --check-state`` runs *the new code* in a fresh process: it opens the database
   read-only, runs ``quick_check`` and compares schema versions (older ones it migrates at
   start; newer ones it refuses). It also reports which shim formats it can adopt.
2. ``handover_problem`` (pure) compares that with the running daemon's ``/version``
   (``handover``: its shim format; absent on old daemons, which all used format 1).

Then the old daemon is asked to shut down (agents run under their own shims, outside it),
the new one is started, and the agents it reattached are compared with those before: same
ids, same pids, still alive. A workspace whose daemon runs under systemd is restarted
through ``systemctl --user restart`` instead, so the unit keeps owning it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from gridd import __version__
from gridd.cli import daemonctl
from gridd.client import GridClient
from gridd.errors import DaemonUnreachable, GriddError
from gridd.workspace import Workspace

CHECK_TIMEOUT = 120.0
REATTACH_TIMEOUT = 15.0


def handover_problem(old_handover: int | None, adopts: list[int]) -> str | None:
    """Why the new daemon cannot take over the old one's agents, or None (pure)."""
    old = 1 if old_handover is None else old_handover
    if old in adopts:
        return None
    return (
        f"the running gridd's agents use shim format {old}; this gridd adopts only"
        f" {', '.join(map(str, adopts)) or 'none'}: its agents would be orphaned"
    )


def check_new_version(ws: Workspace) -> dict[str, Any]:
    """Run the installed gridd's ``--check-state``; raise with its reason when it says no."""
    try:
        result = daemonctl.run_gridd_check(ws, "--check-state", timeout=CHECK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GriddError(
            f"could not run the new gridd's state check: {exc}; nothing was stopped",
            code="upgrade_check_failed",
        ) from None
    try:
        report: dict[str, Any] = json.loads(result.stdout)
    except json.JSONDecodeError:
        report = {}
    if result.returncode != 0 or not report.get("readable"):
        reason = report.get("problem") or result.stderr.strip() or f"exit {result.returncode}"
        raise GriddError(
            f"the installed gridd {report.get('gridd_version', __version__)} cannot use this"
            f" workspace's state: {reason}. Nothing was stopped; the running daemon serves on.",
            code="upgrade_refused",
            details={"check": report},
        )
    return report


def _agents(ws: Workspace, *, exited: bool = False) -> dict[str, dict[str, Any]]:
    """Live agents by id (with ``exited``: every agent the daemon knows)."""
    params = {"all": "1"} if exited else {}
    with GridClient(ws.socket_path, timeout=10) as client:
        return {a["id"]: a for a in client.get("/agents", params=params)}


def _old_version(ws: Workspace) -> dict[str, Any]:
    with GridClient(ws.socket_path, timeout=10) as client:
        info: dict[str, Any] = client.get("/version")
        return info


def _unit_installed(ws: Workspace) -> str | None:
    """The systemd unit that owns this workspace's daemon, if one is installed and active."""
    from gridd.cli.service_cmd import manager_for, render

    manager = manager_for("systemd", dict(os.environ))
    unit = render(manager, ws)
    if not (manager.directory / unit.filename).exists():
        return None
    active = manager.run("systemctl", "--user", "is-active", unit.label)
    return unit.label if active is not None and active.stdout.strip() == "active" else None


def _restart(ws: Workspace, unit: str | None) -> daemonctl.DaemonStatus:
    if unit is None:
        daemonctl.stop(ws)
        status, _ours = daemonctl.start(ws)
        return status
    result = subprocess.run(
        ["systemctl", "--user", "restart", unit],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise GriddError(
            f"systemctl --user restart {unit} failed: {result.stderr.strip()}",
            code="upgrade_restart_failed",
        )
    deadline = time.monotonic() + daemonctl.START_TIMEOUT * 2
    while time.monotonic() < deadline:
        answer = daemonctl.probe(ws, timeout=1.0)
        if answer is not None:
            return answer
        time.sleep(daemonctl.POLL_INTERVAL)
    raise GriddError(
        f"{unit} did not answer after the restart; see journalctl --user -u {unit}",
        code="upgrade_restart_failed",
    )


def _wait_reattached(ws: Workspace, before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every agent the new daemon knows, once each one from before is accounted for."""
    deadline = time.monotonic() + REATTACH_TIMEOUT
    after: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        try:
            after = _agents(ws, exited=True)
        except DaemonUnreachable:
            after = {}
        if all(agent_id in after for agent_id in before):
            break
        time.sleep(daemonctl.POLL_INTERVAL)
    return after


def classify(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> tuple[list[str], list[str], list[str]]:
    """(kept: live with the same pid, finished: ended meanwhile, lost: the rest) (pure)."""
    kept, finished, lost = [], [], []
    for agent_id, agent in before.items():
        now = after.get(agent_id)
        if now is None:
            lost.append(agent_id)
        elif now.get("status") == "exited":
            finished.append(agent_id)
        elif now.get("pid") == agent.get("pid"):
            kept.append(agent_id)
        else:
            lost.append(agent_id)
    return kept, finished, lost


def run_upgrade(ws: Workspace) -> int:
    old = daemonctl.probe(ws)
    report = check_new_version(ws)
    daemonctl.check_config(ws, doing="upgrade")
    print(
        f"state check by gridd {report['gridd_version']}: schema {report['schema']}"
        f" (supports {report['supported_schema']}), quick_check {report['integrity']}"
    )
    if old is None:
        status, _ours = daemonctl.start(ws)
        print(f"gridd was not running; started gridd {status.version} (pid {status.pid})")
        return 0
    info = _old_version(ws)
    problem = handover_problem(info.get("handover"), list(report.get("adopts", [])))
    if problem is not None:
        raise GriddError(
            f"cannot hand over from gridd {old.version} (pid {old.pid}): {problem}. Nothing was"
            " stopped. Stop the session first ('gridctl session stop'), let its agents end,"
            " then 'gridctl daemon restart'.",
            code="upgrade_cannot_hand_over",
        )
    before = _agents(ws)
    unit = _unit_installed(ws)
    how = f"systemctl --user restart {unit}" if unit else "stop, then start"
    print(
        f"handing over from gridd {old.version} (pid {old.pid}) with {len(before)} running"
        f" agent(s) ({how})"
    )
    new = _restart(ws, unit)
    after = _wait_reattached(ws, before)
    kept, finished, lost = classify(before, after)
    print(
        f"gridd {new.version} serving (pid {new.pid}); {len(kept)} agent(s) kept running"
        + (f": {', '.join(kept)}" if kept else "")
    )
    if finished:
        print(f"  ended during the handover and finished by the new daemon: {', '.join(finished)}")
    if lost:
        print(f"gridctl: not reattached: {', '.join(lost)} (see {ws.log_path})", file=sys.stderr)
        return 1
    return 0
