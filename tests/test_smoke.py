from __future__ import annotations

from tests.support.daemons import DaemonProc


def test_daemon_answers_health_over_its_socket(daemon: DaemonProc) -> None:
    body = daemon.client().get("/health")
    assert body["status"] == "ok"
    assert body["pid"] == daemon.proc.pid
