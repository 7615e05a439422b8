"""A sandboxed agent reaches only what its profile allows: with ``network = "allowlist"`` the
kernel (Landlock's TCP rules) refuses every TCP connection but the one to its run's
filtering proxy, the proxy refuses every host not listed (403, ``agent.sandbox_denied``) and
lets the listed ones through; the agent cannot call the daemon's API over its socket, and a
set-user-ID program gains it nothing (``no_new_privs``). What the kernel refuses (a direct
connection, a listener, a datagram or ICMP socket) is an ``agent.sandbox_denied`` event
too (the shim's seccomp listener: ``runs/refusals.py``), rate-limited, published once
across a daemon restart; the agent never holds the listener.

Real daemon, real shims, real processes and sockets on this kernel; every attack is also run
with the sandbox off (the control), where it works, so the tests prove the sandbox did it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridd.client import GridClient
from gridd.runs import egress, landlock, refusals
from tests.support.api import wait_task_status
from tests.support.cli import GRIDCTL, gridctl
from tests.support.daemons import core_daemon, restartable_daemon
from tests.support.git import git_show
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for

pytestmark = pytest.mark.skipif(
    landlock.abi_version() < landlock.NET_ABI,
    reason="this kernel's Landlock has no TCP rules (ABI 4)",
)

ATTACKS = ["direct", "proxy_forbidden", "bind", "setuid", "daemon_socket", "udp", "raw"]
REACHES = ["proxy_allowed", "http_allowed"]


class Hello:
    """A loopback listener answering any request with ``hello``; on the same port over UDP,
    an echo of each datagram."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.datagrams: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        threading.Thread(target=self._echo, daemon=True).start()

    def _echo(self) -> None:
        while True:
            try:
                data, peer = self.udp.recvfrom(64)
                self.datagrams.append(data)
                self.udp.sendto(data, peer)
            except OSError:
                return

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(5)
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.0 200 OK\r\ncontent-length: 6\r\n\r\nhello\n")
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()
        self.udp.close()


@pytest.fixture
def listeners() -> Iterator[tuple[Hello, Hello]]:
    forbidden, allowed = Hello(), Hello()
    try:
        yield forbidden, allowed
    finally:
        forbidden.close()
        allowed.close()


@pytest.fixture
def setuid_program() -> Iterator[str]:
    """A program whose set-user-ID bit would change the effective uid: run as root, a copy
    of ``sleep`` owned by ``nobody``; run as anyone else, ``su`` (set-user-ID root)."""
    if os.geteuid() != 0:
        su = shutil.which("su")
        if su is None or not os.stat(su).st_mode & 0o4000:
            pytest.skip("no set-user-ID su here, and only root can make another")
        yield su
        return
    with tempfile.TemporaryDirectory(prefix="gs") as d:
        os.chmod(d, 0o755)
        program = Path(d) / "sleep"
        shutil.copy2(shutil.which("sleep") or "/bin/sleep", program)
        os.chown(program, 65534, 65534)
        os.chmod(program, 0o4755)
        yield str(program)


def _config(
    repo: Path, listeners: tuple[Hello, Hello], program: str, box: dict[str, object]
) -> None:
    forbidden, allowed = listeners
    write_core_config(
        repo,
        agents={
            "boxed": {
                "command": agent_command(
                    "network_attacks.py", str(forbidden.port), str(allowed.port), program
                ),
                "sandbox": box,
            }
        },
        scheduler={"default_agent": "boxed"},
    )


def _allowlist(allowed: Hello) -> dict[str, object]:
    return {
        "mode": "workspace",
        "network": "allowlist",
        "allow_hosts": [f"127.0.0.1:{allowed.port}"],
    }


def _results(repo: Path) -> dict[str, dict[str, str]]:
    found = {
        who: git_show(repo, f"grid/net:{name}")
        for who, name in (("agent", "network.json"), ("grandchild", "network-grandchild.json"))
    }
    assert all(found.values()), f"the agent's results were not committed: {found}"
    return {who: json.loads(text or "{}") for who, text in found.items()}


def _run(c: GridClient, status: str = "review") -> dict[str, object]:
    """The attacker's task, started in a session and seen to reach ``status``."""
    c.post("/tasks", {"id": "net", "title": "network attacks", "maxAttempts": 1})
    c.post("/session/start", {"maxAgents": 1})
    return wait_task_status(c, "net", status, timeout=60)


def _kernel(denied: list[dict[str, object]]) -> list[tuple[object, object]]:
    """The refusals the kernel made (not the proxy's ``network`` ones), as (kind, target)."""
    return [(d["kind"], d["target"]) for d in denied if d["kind"] != "network"]


def _counted(denied: list[dict[str, object]]) -> int:
    """How many refusals these events stand for: each, and those it says were held back."""
    return sum(1 + int(str(d["unreported"])) for d in denied)


#: What the ICMP attack's refused ``socket()`` is called (``network_attacks._raw``).
ICMP = "raw" if os.geteuid() == 0 else "icmp"


def _started(c: GridClient, title: str) -> dict[str, object]:
    """The task ``net`` started in a session, and its agent once it runs."""
    c.post("/tasks", {"id": "net", "title": title, "maxAttempts": 1})
    c.post("/session/start", {"maxAgents": 1})
    return wait_for(lambda: [a for a in c.get("/agents") if a["pid"]], timeout=30)[0]


def _verdicts(result: dict[str, str]) -> dict[str, str]:
    return {name: outcome.split(":")[0] for name, outcome in result.items()}


def test_an_allowlisted_sandbox_reaches_only_its_hosts_and_reports_the_rest(
    repo: Path, listeners: tuple[Hello, Hello], setuid_program: str
) -> None:
    forbidden, allowed = listeners
    _config(repo, listeners, setuid_program, _allowlist(allowed))
    with core_daemon(repo) as daemon:
        c = daemon.client()
        _run(c)
        (agent,) = c.get("/agents", params={"all": "1"})
        denied = [e.data for e in event_log(c, types={"agent.sandbox_denied"})]
        listed = gridctl(repo, "agents", "--all", env={**os.environ, "COLUMNS": "300"})
    assert f"network: 127.0.0.1:{allowed.port}" in listed.stdout, listed.stdout
    box = agent["sandbox"]
    assert box["network"] == "allowlist"
    assert box["allowHosts"] == [f"127.0.0.1:{allowed.port}"]
    results = _results(repo)
    for who, result in results.items():
        verdicts = _verdicts(result)
        assert verdicts == {
            **dict.fromkeys(ATTACKS, "denied"),
            **dict.fromkeys(REACHES, "allowed"),
        }, (
            who,
            result,
        )
        assert "Permission denied" in result["direct"], result  # the kernel's EACCES
        assert "403" in result["proxy_forbidden"], result
        assert "sandboxed" in result["daemon_socket"] or "403" in result["daemon_socket"], result
    target = f"127.0.0.1:{forbidden.port}"
    # The agent and its grandchild each asked the proxy once for the forbidden listener.
    assert [(d["target"], d["taskId"]) for d in denied if d["kind"] == "network"] == [
        (target, "net")
    ] * 2, denied
    assert all(d["agentId"] == agent["id"] and d["taskId"] == "net" for d in denied)
    # And each was refused by the kernel a direct connection, a listener, a datagram socket
    # and an ICMP one: every one of them an event (the connection to the proxy is not).
    assert Counter(_kernel(denied)) == {
        ("connect", target): 2,
        ("bind", "127.0.0.1:0"): 2,
        ("socket", "udp"): 2,
        ("socket", ICMP): 2,
    }, denied
    assert forbidden.datagrams == [], "a datagram got past the sandbox"


def test_without_the_sandbox_every_network_attack_works(
    repo: Path, listeners: tuple[Hello, Hello], setuid_program: str
) -> None:
    """The control: the same agent with the sandbox off does every one of them."""
    _config(repo, listeners, setuid_program, {"mode": "off"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        _run(c)
        assert event_log(c, types={"agent.sandbox_denied"}) == []
    for who, result in _results(repo).items():
        assert _verdicts(result) == dict.fromkeys(ATTACKS + REACHES, "allowed"), f"{who}: {result}"
    assert listeners[0].datagrams == [b"hello"] * 2


def test_a_sandbox_without_network_reaches_nothing_over_tcp_udp_or_icmp(
    repo: Path, listeners: tuple[Hello, Hello], setuid_program: str
) -> None:
    """``network = "none"``: no proxy, no TCP connection anywhere, the listed host neither,
    and no datagram or ICMP socket (seccomp: Landlock's rules are TCP's)."""
    _config(repo, listeners, setuid_program, {"mode": "workspace", "network": "none"})
    with core_daemon(repo) as daemon:
        c = daemon.client()
        _run(c)
        (agent,) = c.get("/agents", params={"all": "1"})
        denied = [e.data for e in event_log(c, types={"agent.sandbox_denied"})]
    assert agent["sandbox"]["network"] == "none" and "proxyPort" not in agent["sandbox"]
    # Seven refusals each for the agent and its grandchild (four TCP connections, a
    # listener, a datagram socket, an ICMP one): the shim writes eight lines a minute and
    # says the rest with the last, at the run's end; every kind is among them.
    forbidden, allowed = (f"127.0.0.1:{h.port}" for h in listeners)
    assert _counted(denied) == 14, denied
    assert len(denied) == refusals.BURST + 1, denied
    assert set(_kernel(denied)) == {
        ("connect", forbidden),
        ("connect", allowed),
        ("bind", "127.0.0.1:0"),
        ("socket", "udp"),
        ("socket", ICMP),
    }, denied
    for who, result in _results(repo).items():
        assert _verdicts(result) == dict.fromkeys(ATTACKS + REACHES, "denied"), (who, result)
        assert "Permission denied" in result["proxy_allowed"], result
        assert "Permission denied" in result["udp"], result
    assert listeners[0].datagrams == [], "a datagram got past the sandbox"


def test_a_kernel_without_tcp_rules_starts_no_network_restricted_run(
    repo: Path, listeners: tuple[Hello, Hello], setuid_program: str
) -> None:
    """``[daemon] landlock_abi = 3`` stands for a kernel with Landlock but no TCP rules:
    the run never starts, and the task says what is missing. Doctor says it too."""
    _config(repo, listeners, setuid_program, _allowlist(listeners[1]))
    with (repo / ".grid" / "config.toml").open("a") as config:
        config.write("\n[daemon]\nlandlock_abi = 3\n")
    with core_daemon(repo) as daemon:
        c = daemon.client()
        task = _run(c, "failed")
        (agent,) = c.get("/agents", params={"all": "1"})
    error = str(task["error"])
    assert error.startswith("could not start the agent: sandbox_unavailable:"), error
    assert "needs Landlock ABI 4" in error and "offers ABI 3" in error, error
    assert 'network = "allow"' in error, error
    assert agent["pid"] is None
    found = gridctl(repo, "doctor", "--json", env={**os.environ, "COLUMNS": "300"})
    check = {c["check"]: c for c in json.loads(found.stdout)}["sandbox"]
    assert found.returncode == 1 and check["verdict"] == "fail", check
    assert "has no TCP rules" in check["detail"], check
    assert "boxed (network allowlist)" in check["detail"], check


def test_a_restarted_daemon_opens_a_running_agents_proxy_again_on_its_port(
    repo: Path, listeners: tuple[Hello, Hello]
) -> None:
    """The agent's ruleset names its proxy's port for good: the daemon that reattaches it
    listens there again, with the same list."""
    forbidden, allowed = listeners
    probe = "\n".join(
        [
            "import os,socket,sys,time",
            "from urllib.parse import urlsplit",
            "p=urlsplit(os.environ['HTTPS_PROXY'])",
            "def ask(port):",
            "    s=socket.create_connection((p.hostname,p.port),timeout=5)",
            "    s.sendall(f'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n'.encode())",
            "    return s.recv(100).split(b'\\r\\n')[0].decode()",
            f"print('before', ask({allowed.port}), flush=True)",
            "while not os.path.exists('go'): time.sleep(0.05)",
            f"print('after', ask({allowed.port}), ask({forbidden.port}), flush=True)",
        ]
    )
    write_core_config(
        repo,
        agents={"boxed": {"command": ["python3", "-c", probe], "sandbox": _allowlist(allowed)}},
        scheduler={"default_agent": "boxed"},
    )
    with restartable_daemon(repo) as grid:
        c = grid.client()
        before = _started(c, "restart")
        log = Path(before["runDir"]) / "output.log"
        wait_for(lambda: "before" in log.read_text(), timeout=30, message="the first ask")
        grid.kill9()
        grid.start()
        after = wait_for(lambda: [a for a in c.get("/agents") if a["pid"]], timeout=30)[0]
        assert after["pid"] == before["pid"]
        (Path(after["worktreePath"]) / "go").touch()
        wait_task_status(c, "net", "review", timeout=60)
    lines = log.read_text().splitlines()
    assert "before HTTP/1.1 200 Connection established" in lines, lines
    assert "after HTTP/1.1 200 Connection established HTTP/1.1 403 Forbidden" in lines, lines


def test_the_proxy_decides_by_the_name_and_port_the_agent_asked_for() -> None:
    """The decision alone: a host listed without a port is HTTPS and HTTP; ``*.`` is its
    subdomains, not itself; an address is not the name that resolves to it. A plain-HTTP
    request goes on in origin form, without its ``Proxy-*`` headers."""
    rules = [
        egress.HostRule.parse(h)
        for h in ("api.anthropic.com", "*.pypi.org", "[::1]:8080", "10.0.0.1:22")
    ]
    assert egress.allowed("api.anthropic.com", 443, rules)
    assert egress.allowed("API.Anthropic.com.", 80, rules)
    assert not egress.allowed("api.anthropic.com", 22, rules)
    assert not egress.allowed("evil.api.anthropic.com", 443, rules)
    assert egress.allowed("files.pypi.org", 443, rules)
    assert not egress.allowed("pypi.org", 443, rules)
    assert egress.allowed("::1", 8080, rules)
    assert egress.allowed("10.0.0.1", 22, rules)
    assert not egress.allowed("10.0.0.1", 443, rules)
    tunnel = egress.parse_head(b"CONNECT [::1]:8080 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (tunnel.host, tunnel.port, tunnel.tunnel, tunnel.target) == (
        "::1",
        8080,
        True,
        "[::1]:8080",
    )
    plain = egress.parse_head(
        b"GET http://Example.com/a?b=1 HTTP/1.1\r\nHost: example.com\r\n"
        b"Proxy-Authorization: Basic eA==\r\n\r\n"
    )
    assert (plain.host, plain.port, plain.tunnel) == ("example.com", 80, False)
    assert plain.forward == b"GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\n\r\n"
    for bad in (b"GET /relative HTTP/1.1\r\n\r\n", b"CONNECT nohost HTTP/1.1\r\n\r\n"):
        with pytest.raises(egress.BadRequest):
            egress.parse_head(bad)
    limit = egress.DenialLimit(burst=2, window=60)
    assert [limit.take("a", now=t) for t in (0, 1, 2, 3)] == [0, 0, None, None]
    assert limit.take("a", now=61) == 2  # the two held back, said with the next one
    assert limit.take("b", now=3) == 0


def test_gridctl_logs_follow_says_what_the_sandbox_refused(
    repo: Path, listeners: tuple[Hello, Hello]
) -> None:
    """A refusal by the proxy reaches the person following the agent's output."""
    forbidden, allowed = listeners
    probe = "\n".join(
        [
            "import os,socket,time",
            "from urllib.parse import urlsplit",
            "p=urlsplit(os.environ['HTTPS_PROXY'])",
            "print('ready', flush=True)",
            "while not os.path.exists('ask'): time.sleep(0.05)",
            "s=socket.create_connection((p.hostname,p.port),timeout=5)",
            f"s.sendall(b'CONNECT 127.0.0.1:{forbidden.port} HTTP/1.1\\r\\n\\r\\n')",
            "print('asked', s.recv(100).split(b'\\r\\n')[0].decode(), flush=True)",
            "try:",
            f"    socket.create_connection(('127.0.0.1', {forbidden.port}), timeout=5)",
            "except OSError as exc:",
            "    print('direct', exc.strerror, flush=True)",
        ]
    )
    write_core_config(
        repo,
        agents={"boxed": {"command": ["python3", "-c", probe], "sandbox": _allowlist(allowed)}},
        scheduler={"default_agent": "boxed"},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        agent = _started(c, "follow")
        log = Path(agent["runDir"]) / "output.log"
        wait_for(lambda: "ready" in log.read_text(), timeout=30, message="the agent to be ready")
        follower = subprocess.Popen(
            [*GRIDCTL, "logs", "--follow", "net"],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert follower.stdout is not None
            assert follower.stdout.readline() == "ready\n"  # following: its mark is taken
            (Path(agent["worktreePath"]) / "ask").touch()
            out, err = follower.communicate(timeout=60)
        finally:
            follower.kill()
    assert "asked HTTP/1.1 403 Forbidden" in out, out
    assert "direct Permission denied" in out, out
    assert f"gridctl: sandbox refused network 127.0.0.1:{forbidden.port}\n" in err, err
    # The kernel's refusal of the direct connection too (the shim's listener saw it).
    assert f"gridctl: sandbox refused connect 127.0.0.1:{forbidden.port}\n" in err, err


def _no_network(repo: Path, probe: list[str]) -> None:
    write_core_config(
        repo,
        agents={
            "boxed": {
                "command": ["python3", "-c", "\n".join(probe)],
                "sandbox": {"mode": "workspace", "network": "none"},
            }
        },
        scheduler={"default_agent": "boxed"},
    )


def _fds(pid: int | str) -> list[str]:
    """What each of a process's descriptors is (``/proc/<pid>/fd``)."""
    found = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            continue  # closed meanwhile
    return found


LISTENER = "anon_inode:seccomp notify"


def test_a_loop_of_refused_connections_is_a_bounded_record_and_only_the_shim_holds_it(
    repo: Path, listeners: tuple[Hello, Hello]
) -> None:
    """500 refused connections: a few lines in ``denied.ndjson`` and as many events, the
    last saying how many were held back; the seccomp listener is the shim's, never the
    agent's."""
    forbidden, _ = listeners
    _no_network(
        repo,
        [
            "import os,socket,time",
            "print('fds', *[os.readlink(f'/proc/self/fd/{n}') for n in os.listdir('/proc/self/fd')"
            " if os.path.exists(f'/proc/self/fd/{n}')], sep='|', flush=True)",
            "for _ in range(500):",
            "    try:",
            f"        socket.create_connection(('127.0.0.1', {forbidden.port}), timeout=5)",
            "    except PermissionError:",
            "        pass",
            "print('looped', flush=True)",
            "while not os.path.exists('end'): time.sleep(0.05)",
        ],
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        agent = _started(c, "loop")
        log = Path(agent["runDir"]) / "output.log"
        wait_for(lambda: "looped" in log.read_text(), timeout=60, message="the loop")
        held_by = {"shim": _fds(agent["shimPid"]), "agent": _fds(agent["pid"])}
        (Path(agent["worktreePath"]) / "end").touch()
        wait_task_status(c, "net", "review", timeout=60)
        denied = [e.data for e in event_log(c, types={"agent.sandbox_denied"})]
    assert held_by["shim"].count(LISTENER) == 1, held_by
    assert LISTENER not in held_by["agent"], held_by
    printed = next(line for line in log.read_text().splitlines() if line.startswith("fds|"))
    assert LISTENER not in printed.split("|"), printed  # nor at its start
    lines = (Path(agent["runDir"]) / refusals.DENIED_FILE).read_text().splitlines()
    assert len(lines) == refusals.BURST + 1, lines  # the last one at the run's end
    assert sum(1 + json.loads(line)["unreported"] for line in lines) == 500, lines
    assert set(_kernel(denied)) == {("connect", f"127.0.0.1:{forbidden.port}")}, denied
    assert len(denied) == refusals.BURST + 1 and _counted(denied) == 500, denied
    assert int(str(denied[-1]["unreported"])) == 500 - refusals.BURST - 1, denied


def test_refusals_made_while_the_daemon_is_away_are_published_once_when_it_returns(
    repo: Path, listeners: tuple[Hello, Hello]
) -> None:
    """One refusal published, the daemon killed, another made meanwhile: the restarted
    daemon publishes the second, and not the first again (``denied_offset``)."""
    first, second = (f"127.0.0.1:{h.port}" for h in listeners)
    _no_network(
        repo,
        [
            "import os,socket,time",
            "def knock(port):",
            "    try:",
            "        socket.create_connection(('127.0.0.1', port), timeout=5)",
            "    except PermissionError as exc:",
            "        print('refused', port, flush=True)",
            f"knock({listeners[0].port})",
            "while not os.path.exists('go'): time.sleep(0.05)",
            f"knock({listeners[1].port})",
            "while not os.path.exists('end'): time.sleep(0.05)",
        ],
    )
    kinds = {"agent.sandbox_denied"}
    with restartable_daemon(repo) as grid:
        c = grid.client()
        before = _started(c, "restart")
        wait_for(lambda: event_log(c, types=kinds), timeout=30, message="the first refusal")
        grid.kill9()
        denied_file = Path(before["runDir"]) / refusals.DENIED_FILE
        (Path(before["worktreePath"]) / "go").touch()
        wait_for(
            lambda: len(denied_file.read_text().splitlines()) == 2,
            timeout=30,
            message="the second refusal, recorded by the shim",
        )
        grid.start()
        after = wait_for(lambda: [a for a in c.get("/agents") if a["pid"]], timeout=30)[0]
        assert after["pid"] == before["pid"]
        wait_for(
            lambda: len(event_log(c, types=kinds)) >= 2, timeout=30, message="the second event"
        )
        (Path(after["worktreePath"]) / "end").touch()
        wait_task_status(c, "net", "review", timeout=60)
        denied = [e.data for e in event_log(c, types=kinds)]
    assert _kernel(denied) == [("connect", first), ("connect", second)], denied


def test_a_run_holds_at_most_its_share_of_proxy_connections() -> None:
    """Past ``MAX_CONNECTIONS`` open at once, the proxy answers 503 and holds nothing more;
    one closed makes room again. Nothing is allocated for the relay before a connection
    is allowed."""

    async def scenario() -> tuple[bytes, bytes]:
        proxies = egress.EgressProxies(lambda *denied: None)
        port = await proxies.open("run", ["example.invalid"])
        held = [
            await asyncio.open_connection("127.0.0.1", port) for _ in range(egress.MAX_CONNECTIONS)
        ]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        refused = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        freed_reader, freed = held.pop()
        freed.write_eof()
        await asyncio.wait_for(freed_reader.read(), 10)  # the proxy closed its end: freed
        again_reader, again = await asyncio.open_connection("127.0.0.1", port)
        again.write(b"CONNECT elsewhere.invalid:443 HTTP/1.1\r\n\r\n")
        answered = await asyncio.wait_for(again_reader.readline(), 10)
        for _, w in held:
            w.close()
        again.close()
        proxies.close_all()
        return refused, answered

    refused, answered = asyncio.run(scenario())
    assert refused.startswith(b"HTTP/1.1 503 "), refused
    assert answered.startswith(b"HTTP/1.1 403 "), answered


def test_the_proxy_answers_an_oversized_head_400_and_drops_a_slow_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A head past ``HEAD_LIMIT`` is answered 400; one that does not end within the
    timeout (here 0.5 s) is dropped unanswered; neither reaches anything."""
    monkeypatch.setattr(egress, "TIMEOUT_SECONDS", 0.5)

    def ask(port: int, head: bytes) -> bytes:
        """What the proxy answers before it closes (a reset after its answer included:
        it closes with the rest of a head too long unread)."""
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head)
            got = b""
            try:
                while data := sock.recv(65536):
                    got += data
            except ConnectionResetError:
                pass
            return got

    async def scenario() -> tuple[bytes, bytes]:
        proxies = egress.EgressProxies(lambda *denied: None)
        port = await proxies.open("run", ["example.invalid"])
        long = b"CONNECT example.invalid:443 HTTP/1.1\r\nx: " + b"y" * egress.HEAD_LIMIT
        too_long = await asyncio.to_thread(ask, port, long)
        slow = await asyncio.to_thread(ask, port, b"CONNECT example.invalid:443 HTTP/1.1\r\n")
        proxies.close_all()
        return too_long, slow

    too_long, slow = asyncio.run(scenario())
    assert too_long.startswith(b"HTTP/1.1 400 "), too_long
    assert b"too long" in too_long, too_long
    assert slow == b""


def test_a_stopping_daemon_ends_an_agents_open_tunnel_and_does_not_wait_on_it(
    repo: Path,
) -> None:
    """An agent holds a quiet tunnel through its proxy (the relay waiting to read both
    ways); the daemon told to stop exits as usual, and the server sees the tunnel end."""
    server = socket.create_server(("127.0.0.1", 0))
    port = int(server.getsockname()[1])
    probe = "\n".join(
        [
            "import os,socket,time",
            "from urllib.parse import urlsplit",
            "p=urlsplit(os.environ['HTTPS_PROXY'])",
            "s=socket.create_connection((p.hostname,p.port),timeout=5)",
            f"s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n')",
            "print('tunnel', s.recv(100).split(b'\\r\\n')[0].decode(), flush=True)",
            "time.sleep(600)",
        ]
    )
    box = {"mode": "workspace", "network": "allowlist", "allow_hosts": [f"127.0.0.1:{port}"]}
    write_core_config(
        repo,
        agents={"boxed": {"command": ["python3", "-c", probe], "sandbox": box}},
        scheduler={"default_agent": "boxed"},
    )
    try:
        with core_daemon(repo) as daemon:
            c = daemon.client()
            c.post("/tasks", {"id": "net", "title": "a quiet tunnel", "maxAttempts": 1})
            c.post("/session/start", {"maxAgents": 1})
            server.settimeout(30)
            upstream, _ = server.accept()  # the proxy reached the server for the agent
            agent = wait_for(lambda: [a for a in c.get("/agents") if a["pid"]], timeout=30)[0]
            log = Path(agent["runDir"]) / "output.log"
            wait_for(lambda: "tunnel" in log.read_text(), timeout=30, message="the tunnel")
            assert daemon.stop(timeout=15) == 0
            upstream.settimeout(10)
            assert upstream.recv(1) == b""  # the tunnel ended with the daemon
            upstream.close()
        assert "tunnel HTTP/1.1 200 Connection established" in log.read_text()
    finally:
        server.close()


def test_the_proxys_port_reaches_the_proxy_and_no_other_host(
    repo: Path, listeners: tuple[Hello, Hello]
) -> None:
    """Landlock's TCP rules name a port, not an address: on their own they let an agent
    reach a server of anyone's listening on its proxy's port at another address. The
    shim connects an internet socket itself, and only to the proxy: a connection to
    127.0.0.2 on that port is refused and an event, while the proxy is reached, by a
    blocking ``connect`` and by a non-blocking one (``EINPROGRESS``, as ever)."""
    assert refusals.PROXY_HOST == egress.LOOPBACK  # where the shim connects is the proxy's
    _, allowed = listeners
    write_core_config(
        repo,
        agents={
            "boxed": {
                "command": [
                    "python3",
                    "-c",
                    "\n".join(
                        [
                            "import errno, json, os, select, socket, time",
                            "from urllib.parse import urlsplit",
                            "port = urlsplit(os.environ['HTTPS_PROXY']).port",
                            "while not os.path.exists('go'): time.sleep(0.05)",
                            "def hello(s):",
                            "    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')",
                            "    return 'allowed' if b'hello' in s.recv(64) else 'no hello'",
                            "def tunnel(s):",
                            f"    s.sendall(b'CONNECT 127.0.0.1:{allowed.port} HTTP/1.1\\r\\n\\r\\n')",
                            "    head = s.recv(64)",
                            "    return hello(s) if b' 200 ' in head else repr(head)",
                            "out = {}",
                            "try:",
                            "    out['elsewhere'] = hello(socket.create_connection(('127.0.0.2', port)))",
                            "except OSError as e:",
                            "    out['elsewhere'] = f'denied {errno.errorcode[e.errno]}'",
                            "s = socket.socket()",
                            "s.connect(('127.0.0.1', port))",
                            "out['blocking'] = tunnel(s)",
                            "s = socket.socket()",
                            "s.setblocking(False)",
                            "out['started'] = errno.errorcode.get(s.connect_ex(('127.0.0.1', port)), 'ok')",
                            "select.select([], [s], [], 5)",
                            "s.setblocking(True)",
                            "out['nonblocking'] = tunnel(s)",
                            "print('results', json.dumps(out), flush=True)",
                        ]
                    ),
                ],
                "sandbox": _allowlist(allowed),
            }
        },
        scheduler={"default_agent": "boxed"},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        agent = _started(c, "elsewhere")
        port = int(agent["sandbox"]["proxyPort"])
        # Anyone's server, on another loopback address, on the proxy's port.
        elsewhere = socket.create_server(("127.0.0.2", port))
        reached: list[bytes] = []

        def serve() -> None:
            with contextlib.suppress(OSError):
                conn, _ = elsewhere.accept()
                with conn:
                    reached.append(conn.recv(64))
                    conn.sendall(b"hello\n")

        threading.Thread(target=serve, daemon=True).start()
        try:
            (Path(agent["worktreePath"]) / "go").touch()
            wait_task_status(c, "net", "review", timeout=60)
        finally:
            elsewhere.close()
        denied = [e.data for e in event_log(c, types={"agent.sandbox_denied"})]
    printed = (Path(agent["runDir"]) / "output.log").read_text()
    line = next(x for x in printed.splitlines() if x.startswith("results "))
    assert json.loads(line.split(" ", 1)[1]) == {
        "elsewhere": "denied EACCES",
        "blocking": "allowed",
        "started": "EINPROGRESS",
        "nonblocking": "allowed",
    }, printed
    assert reached == [], "a connection reached another host on the proxy's port"
    assert _kernel(denied) == [("connect", f"127.0.0.2:{port}")], denied
