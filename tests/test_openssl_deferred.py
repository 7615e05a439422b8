"""OpenSSL is loaded on first use, not at the daemon's start (``gridd.lean.defer_openssl``).

A daemon serving a Unix socket needs TLS only for a webhook over https, and a hash only for
a committed config: ``ssl``, ``hashlib`` and ``hmac`` (which load ``libcrypto`` and
``libssl``, 4.5 MB of an idle daemon) run their code when first used. These tests prove that
what was put off works whole when used: a real daemon's https webhook, asyncio TLS, hashes
and HMACs, and the stand-ins given to code that takes names from ``ssl`` at import.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.helpers import event_log, running_daemon, wait_for, write_config


def _run(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter after ``defer_openssl()``; it prints JSON last."""
    prelude = "import sys, json\nfrom gridd.lean import defer_openssl\nassert defer_openssl()\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout.splitlines()[-1]))


def _openssl_mapped(pid: int) -> bool:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return "libcrypto" in maps or "libssl" in maps


def test_hashes_hmacs_and_tokens_are_right_and_only_hashing_loads_openssl() -> None:
    out = _run(
        "import secrets, hashlib, hmac\n"
        "token = secrets.token_hex(3)\n"
        "equal = secrets.compare_digest('abc', 'abc') and not secrets.compare_digest(b'a', b'b')\n"
        "before = '_hashlib' in sys.modules\n"
        "from hashlib import sha256\n"
        "print(json.dumps({'token': token, 'equal': equal, 'before': before,\n"
        "  'sha256': sha256(b'gridd').hexdigest(), 'md5': hashlib.md5(b'x').hexdigest(),\n"
        "  'hmac': hmac.new(b'key', b'message', 'sha256').hexdigest(),\n"
        "  'after': '_hashlib' in sys.modules}))"
    )
    assert len(out["token"]) == 6 and int(out["token"], 16) >= 0
    assert out["equal"] is True
    assert out["before"] is False  # tokens and comparisons need no OpenSSL
    assert out["sha256"] == hashlib.sha256(b"gridd").hexdigest()
    assert out["md5"] == hashlib.md5(b"x").hexdigest()
    assert out["hmac"] == hmac.new(b"key", b"message", "sha256").hexdigest()
    assert out["after"] is True


def test_ssl_names_read_at_import_are_the_real_values_and_classes() -> None:
    out = _run(
        "import typing\n"
        "from gridd.api import uvicorn_core  # uvicorn.config reads TLS defaults at import\n"
        "import uvicorn.config as config\n"
        "import anyio.streams.tls as tls\n"
        "import prometheus_client.exposition as exposition\n"
        "stand_in = tls.SSLContext\n"
        "never_instance = isinstance(object(), stand_in)\n"
        "annotation = typing.Optional[stand_in]\n"
        "loaded_early = '_ssl' in sys.modules\n"
        "class Mine(stand_in):\n"
        "    pass\n"
        "import ssl\n"
        "print(json.dumps({'loaded_early': loaded_early, 'never_instance': never_instance,\n"
        "  'protocol': config.SSL_PROTOCOL_VERSION == ssl.PROTOCOL_TLS_SERVER,\n"
        "  'cert_none': ssl.CERT_NONE == 0,\n"
        "  'client': ssl.PROTOCOL_TLS_CLIENT == 16,\n"
        "  'union': (stand_in | None) == (ssl.SSLContext | None),\n"
        "  'exposition': exposition.ssl is ssl,\n"
        "  'rebound': tls.SSLContext is ssl.SSLContext,\n"
        "  'subclass': issubclass(Mine, ssl.SSLContext),\n"
        "  'instance': isinstance(Mine(ssl.PROTOCOL_TLS_CLIENT), stand_in),\n"
        "  'made': type(stand_in(ssl.PROTOCOL_TLS_CLIENT)) is ssl.SSLContext}))"
    )
    assert out == {
        "loaded_early": False,
        "never_instance": False,
        "protocol": True,
        "cert_none": True,
        "client": True,
        "union": True,
        "exposition": True,
        "rebound": True,
        "subclass": True,
        "instance": True,
        "made": True,
    }


def test_loading_ssl_leaves_other_lazily_loaded_modules_unloaded() -> None:
    # A module importlib's LazyLoader has not loaded yet, whose code would fail: putting
    # the real SSLContext where the stand-in was must not look inside it.
    out = _run(
        "import importlib.abc, importlib.util, asyncio.sslproto\n"
        "class Failing(importlib.abc.Loader):\n"
        "    def create_module(self, spec):\n"
        "        return None\n"
        "    def exec_module(self, module):\n"
        "        raise RuntimeError('this module must not be loaded')\n"
        "spec = importlib.util.spec_from_loader('lazy_failing', importlib.util.LazyLoader(Failing()))\n"
        "sys.modules['lazy_failing'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(sys.modules['lazy_failing'])\n"
        "import ssl\n"
        "ssl.create_default_context()\n"
        "print(json.dumps({'again': asyncio.sslproto.SSLAgainErrors[0] is ssl.SSLWantReadError}))"
    )
    assert out == {"again": True}


def test_asyncio_tls_works_when_ssl_is_first_used_after_asyncio(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem")
    )
    out = _run(
        "import asyncio\n"
        f"folder = {str(tmp_path)!r}\n"
        "async def main():\n"
        "    import ssl\n"
        "    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)\n"
        "    server_ctx.load_cert_chain(folder + '/server.pem')\n"
        "    async def echo(reader, writer):\n"
        "        writer.write((await reader.readline()).upper())\n"
        "        await writer.drain()\n"
        "        writer.close()\n"
        "    server = await asyncio.start_server(echo, '127.0.0.1', 0, ssl=server_ctx)\n"
        "    port = server.sockets[0].getsockname()[1]\n"
        "    client_ctx = ssl.create_default_context(cafile=folder + '/ca.pem')\n"
        "    reader, writer = await asyncio.open_connection('127.0.0.1', port, ssl=client_ctx)\n"
        "    writer.write(b'hello over tls\\n')\n"
        "    answer = await reader.readline()\n"
        "    writer.close()\n"
        "    server.close()\n"
        "    return answer.decode()\n"
        "print(json.dumps({'answer': asyncio.run(asyncio.wait_for(main(), 20))}))"
    )
    assert out == {"answer": "HELLO OVER TLS\n"}


class _HttpsHook:
    """A webhook receiver over https on loopback, with a certificate of a test CA."""

    def __init__(self, folder: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = folder / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.received: list[dict[str, Any]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                hook.received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1").configure_cert(context)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def https_hook(tmp_path: Path) -> Iterator[_HttpsHook]:
    hook = _HttpsHook(tmp_path)
    yield hook
    hook.close()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps")
def test_daemon_at_rest_and_scraped_has_not_loaded_openssl_and_loads_it_for_an_https_webhook(
    repo: Path, https_hook: _HttpsHook
) -> None:
    write_config(
        repo,
        "[notifications]\n"
        f'webhook_url = "{https_hook.url}"\n'
        'events = ["session.stopped"]\n'
        "desktop = false\n"
        "coalesce_seconds = 0\n",
    )
    # The daemon trusts the test CA the way any OpenSSL program does, through SSL_CERT_FILE.
    env = {"SSL_CERT_FILE": str(https_hook.ca_file)}
    with running_daemon(repo, env=env) as daemon:
        client = daemon.client()
        assert "gridd_" in client.get_text("/metrics")  # a scrape (prometheus_client) too
        assert not _openssl_mapped(daemon.proc.pid)
        client.post("/session/start", {"featureBranch": "tls-feature", "maxAgents": 1})
        client.post("/session/stop")
        wait_for(lambda: https_hook.received, timeout=15, message="the https webhook")
        assert _openssl_mapped(daemon.proc.pid)
        failed = event_log(client, types={"notify.failed"})
    assert https_hook.received[0]["event"]["type"] == "session.stopped"
    assert failed == []
