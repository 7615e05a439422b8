"""A stand-in Kubernetes cluster for the kubernetes executor's contract tests.

kmock's ``KubernetesEmulator`` is the API server (objects kept in memory: create with 409
on a taken name, get, list, delete), served on loopback from a thread of its own, as a real
API server is another process. Around it, what kmock does not do, kept small:

- a **kubelet**: a Job created makes its pod (labels from the template, ``job-name``) and
  starts the pod's command on this machine, detached, with ``/grid`` mapped to a
  directory of the pod's; the pod's status follows the process (Running, then Succeeded
  or Failed with the container's exit code);
- the **garbage collector**: deleting a Job deletes its pods (and kills their processes)
  only when the request's ``propagationPolicy`` is Background or Foreground, as the real
  one does; with none, a Job's pods are orphaned (the batch/v1 default);
- the **exec websocket** (``pods/<name>/exec``): the channel protocol, ``v5.channel.k8s.io``
  or only ``v4.channel.k8s.io`` (``protocols``), stdin fed to the command as it arrives (a
  v5 close of stdin closes it), stdout and stderr, and the error channel's Status last
  (``NonZeroExitCode`` with the exit code); an exec into a pod that does not run is
  refused before the upgrade, as the API server does.

Everything the tests do to the cluster (a pod OOM-killed, evicted, a Job past its deadline,
a Job deleted by someone else, a quota full, a pod kept Pending, a pod the quota refuses
with the Job controller's ``FailedCreate`` Event) goes through ``FakeCluster``'s methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import kmock

T = TypeVar("T")
JOBS = "batch/v1/jobs"
PODS = "v1/pods"
EVENTS = "v1/events"
#: The node the stand-in scheduler binds every pod to (``spec.nodeName``).
NODE = "standin-node-1"
#: The kubelet's writes on their way to the pods' watches (kept until put).
ANNOUNCING: set[asyncio.Task[None]] = set()
V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"


@dataclass
class PodRun:
    name: str
    job: str
    namespace: str
    base: Path
    process: asyncio.subprocess.Process | None = None
    labels: dict[str, str] = field(default_factory=dict)


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return aiohttp.web.Response(
        status=code, body=json.dumps(body).encode(), content_type="application/json"
    )


class Cluster(kmock.KubernetesEmulator):  # type: ignore[misc]
    """The API server (kmock) with the kubelet, the garbage collector and exec."""

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base
        self.pods: dict[str, PodRun] = {}
        self.protocols: tuple[str, ...] = (V5, V4)
        self.refuse: tuple[int, str, str] | None = None  # the next Job create's answer
        self.log: list[tuple[str, str, dict[str, str]]] = []  # (method, path, query)
        self.created: list[dict[str, Any]] = []  # every Job created, as it was sent
        #: Pods made while set stay Pending (never scheduled) until ``release_held``.
        self.hold = False
        self.held: dict[str, dict[str, Any]] = {}  # pod name -> its Job, as created
        #: While set, a Job's pod is refused by the namespace's quota (this message), as
        #: the Job controller is: no pod, a ``FailedCreate`` Event on the Job.
        self.pod_quota: str | None = None
        #: The next Job create is carried out but its answer lost (the connection dropped).
        self.lose_answer = False

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        self.log.append((raw.method, raw.path, dict(raw.query)))
        plural = getattr(request.resource, "plural", None)
        if plural == "pods" and request.subresource == "exec":
            return await self._exec(request)
        if plural == "jobs" and raw.method == "POST" and self.refuse is not None:
            code, reason, message = self.refuse
            self.refuse = None
            return _status(code, reason, message)
        if plural == "jobs" and raw.method == "DELETE" and request.name:
            policy = raw.query.get("propagationPolicy")
            response = await super()._handle(request)
            if response.status < 300 and policy in ("Background", "Foreground"):
                for pod in [p for p in self.pods.values() if p.job == request.name]:
                    await self.delete_pod(pod.name)
            return response
        response = await super()._handle(request)
        if plural == "jobs" and raw.method == "POST" and response.status < 300:
            self.created.append(request.data)
            await self._start_pod(request.data)
            if self.lose_answer:
                self.lose_answer = False
                raw.transport.close()  # made, and no answer: as a timeout after the write
        return response

    # -- the kubelet -------------------------------------------------------------------

    async def _start_pod(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        namespace = meta.get("namespace") or "default"
        if self.pod_quota is not None:
            self._refuse_pod(meta["name"], namespace, self.pod_quota)
            return
        name = f"{meta['name']}-{secrets.token_hex(3)[:5]}"
        template = job["spec"]["template"]
        labels = {**(template.get("metadata") or {}).get("labels", {}), "job-name": meta["name"]}
        pod = PodRun(name, meta["name"], namespace, self.base / name, labels=labels)
        pod.base.mkdir(parents=True)
        self.pods[name] = pod
        self._put_pod(pod, {"phase": "Pending"}, template["spec"])
        if self.hold:
            self.held[name] = job
            return
        await self._run_pod(pod, template)

    async def release_held(self) -> None:
        """The held pods still there are scheduled and run (their Job may be gone)."""
        held, self.held = self.held, {}
        for name, job in held.items():
            pod = self.pods.get(name)
            if pod is not None:
                await self._run_pod(pod, job["spec"]["template"])

    def _refuse_pod(self, job: str, namespace: str, message: str) -> None:
        name = f"{job}.{secrets.token_hex(8)}"
        self.objects[EVENTS, namespace, name] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job,
                "namespace": namespace,
            },
            "type": "Warning",
            "reason": "FailedCreate",
            "message": f'Error creating: pods "{job}-x7k2p" is forbidden: {message}',
            "source": {"component": "job-controller"},
            "count": 1,
        }

    async def _run_pod(self, pod: PodRun, template: dict[str, Any]) -> None:
        [container] = template["spec"]["containers"]
        argv = [self._map(pod, arg) for arg in container["command"]]
        argv[0] = sys.executable if argv[0] == "python3" else argv[0]
        out = open(pod.base / "pod.log", "ab")  # noqa: SIM115 (the process keeps it)
        pod.process = await asyncio.create_subprocess_exec(
            *argv, stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL, start_new_session=True
        )
        out.close()
        self._put_pod(pod, _running(), template["spec"])
        asyncio.get_running_loop().create_task(self._reap(pod, template["spec"]))

    async def _reap(self, pod: PodRun, spec: dict[str, Any]) -> None:
        assert pod.process is not None
        code = await pod.process.wait()
        if pod.name not in self.pods:
            return
        current = self.objects[PODS, pod.namespace, pod.name]
        if current is None or (current.raw.get("status") or {}).get("phase") not in (
            "Running",
            "Pending",
        ):
            return  # a test set how it ended (OOMKilled, Evicted): kept
        phase = "Succeeded" if code == 0 else "Failed"
        terminated = {"exitCode": code if code >= 0 else 128 - code, "reason": "Error"}
        self._put_pod(
            pod,
            {
                "phase": phase,
                "containerStatuses": [{"name": "box", "state": {"terminated": terminated}}],
            },
            spec,
        )

    def _put_pod(self, pod: PodRun, status: dict[str, Any], spec: dict[str, Any]) -> None:
        kind = "MODIFIED" if (PODS, pod.namespace, pod.name) in self.objects else "ADDED"
        self.objects[PODS, pod.namespace, pod.name] = raw = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": pod.labels},
            # Bound to the stand-in's one node once it runs, as a scheduler would.
            "spec": spec if status.get("phase") == "Pending" else {**spec, "nodeName": NODE},
            "status": _complete(status),
        }
        self._announce(kind, raw)

    def _announce(self, kind: str, raw: dict[str, Any]) -> None:
        """kmock streams to its watches only what came through its API: what the kubelet
        writes here (a kubelet's status updates) goes to the pods' watches too."""
        buses = [bus for res, bus in self._buses.items() if getattr(res, "plural", "") == "pods"]
        for bus in buses:  # tasks run in the order made: the events stay in order
            task = asyncio.get_running_loop().create_task(bus.put({"type": kind, "object": raw}))
            ANNOUNCING.add(task)
            task.add_done_callback(ANNOUNCING.discard)

    def _map(self, pod: PodRun, arg: str) -> str:
        if arg == "/grid" or arg.startswith("/grid/"):
            return str(pod.base) + arg[len("/grid") :]
        return arg

    async def delete_pod(self, name: str, *, status: dict[str, Any] | None = None) -> None:
        """The pod's process killed; the pod deleted, or (``status``) kept with that status."""
        pod = self.pods.get(name)
        if pod is None:
            return
        if pod.process is not None and pod.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.process.pid, signal.SIGKILL)
        if status is None:
            del self.pods[name]
            with contextlib.suppress(KeyError):
                del self.objects[PODS, pod.namespace, pod.name]
        else:
            current = self.objects[PODS, pod.namespace, pod.name].raw
            self.objects[PODS, pod.namespace, pod.name] = {**current, "status": _complete(status)}

    # -- exec --------------------------------------------------------------------------

    async def _exec(self, request: Any) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        pod = self.pods.get(request.name)
        obj = self.objects[PODS, request.namespace, request.name] if pod else None
        phase = ((obj.raw if obj is not None else {}).get("status") or {}).get("phase")
        if pod is None or obj is None:
            return _status(404, "NotFound", f'pods "{request.name}" not found')
        if phase != "Running":
            return _status(400, "BadRequest", "container box is not running")
        offered = [p.strip() for p in raw.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        usable = [p for p in self.protocols if p in offered]
        ws = aiohttp.web.WebSocketResponse(protocols=tuple(usable[:1]))
        await ws.prepare(raw)
        argv = [self._map(pod, arg) for arg in raw.query.getall("command")]
        argv[0] = sys.executable if argv[0] == "python3" else argv[0]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stdin = proc.stdin

        async def feed() -> None:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                    continue
                channel, data = message.data[0], message.data[1:]
                if channel == 255 and ws.ws_protocol == V5 and data[:1] == b"\x00":
                    stdin.close()
                    return
                if channel == 0 and not stdin.is_closing():
                    stdin.write(data)
                    with contextlib.suppress(ConnectionError):
                        await stdin.drain()

        feeding = asyncio.get_running_loop().create_task(feed())
        out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
        code = await proc.wait()
        feeding.cancel()
        if out:
            await ws.send_bytes(b"\x01" + out)
        if err:
            await ws.send_bytes(b"\x02" + err)
        if code == 0:
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        else:
            status = {
                "metadata": {},
                "status": "Failure",
                "reason": "NonZeroExitCode",
                "message": f"command terminated with non-zero exit code: {code}",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        await ws.send_bytes(b"\x03" + json.dumps(status).encode())
        await ws.close()
        return ws


def _complete(status: dict[str, Any]) -> dict[str, Any]:
    """A pod status with every field a client requires of a container's status."""
    defaults = {"name": "box", "image": "box", "imageID": "", "ready": False, "restartCount": 0}
    statuses = [defaults | c for c in status.get("containerStatuses") or []]
    return {**status, "containerStatuses": statuses} if statuses else status


def _running() -> dict[str, Any]:
    return {
        "phase": "Running",
        "containerStatuses": [{"name": "box", "state": {"running": {}}}],
    }


class FakeCluster:
    """The stand-in cluster on loopback, in a thread with its own event loop."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cluster: Cluster | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._serve, name="fake-cluster", daemon=True)

    def __enter__(self) -> FakeCluster:
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("the stand-in cluster did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        for pod in list(self.cluster.pods.values()) if self.cluster else []:
            if pod.process is not None and pod.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.process.pid, signal.SIGKILL)
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _serve(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with Cluster(self.base) as cluster, kmock.Server(cluster) as server:
                cluster.resources[JOBS] = {}
                cluster.resources[PODS] = {}
                cluster.resources[EVENTS] = {}
                self.cluster, self.url = cluster, str(server.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
                # A watch's handler streams until it is cancelled (aiohttp does not cancel it
                # when its client goes): the server's shutdown would wait its minute for them.
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

        asyncio.run(main())

    def call(self, fn: Callable[[Cluster], Awaitable[T]]) -> T:
        """Run ``fn`` on the cluster's loop (where its state lives) and wait for it."""
        assert self._loop is not None and self.cluster is not None
        cluster = self.cluster

        async def run() -> T:
            return await fn(cluster)

        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(30)

    # -- what tests look at and do -----------------------------------------------------

    def jobs(self) -> dict[str, dict[str, Any]]:
        async def read(c: Cluster) -> dict[str, dict[str, Any]]:
            return {
                key[2]: obj.raw
                for key, obj in list(c.objects._objects.items())
                if key[0].plural == "jobs" and not obj.deleted
            }

        return self.call(read)

    def pods(self) -> dict[str, dict[str, Any]]:
        async def read(c: Cluster) -> dict[str, dict[str, Any]]:
            return {
                key[2]: obj.raw
                for key, obj in list(c.objects._objects.items())
                if key[0].plural == "pods" and not obj.deleted
            }

        return self.call(read)

    def requests(self) -> list[tuple[str, str, dict[str, str]]]:
        assert self.cluster is not None
        return list(self.cluster.log)

    def created(self) -> list[dict[str, Any]]:
        """Every Job created so far, as its client sent it (deleted ones too)."""
        assert self.cluster is not None
        return list(self.cluster.created)

    def refuse_next_create(self, code: int, reason: str, message: str) -> None:
        assert self.cluster is not None
        self.cluster.refuse = (code, reason, message)

    def hold_pods(self) -> None:
        """From now on, each Job's pod stays Pending: never scheduled, its command not run."""
        assert self.cluster is not None
        self.cluster.hold = True

    def release_held(self) -> None:
        """The pods held Pending that are still there run now, as a scheduler would."""

        async def release(c: Cluster) -> None:
            c.hold = False
            await c.release_held()

        self.call(release)

    def refuse_pods_for_quota(self, message: str | None) -> None:
        """From now on (None: no more), a Job is admitted but its pod is refused by the
        namespace's quota: a ``FailedCreate`` Event with ``message`` on the Job, no pod."""
        assert self.cluster is not None
        self.cluster.pod_quota = message

    def lose_next_answer(self) -> None:
        """The next Job create is carried out, but the client never hears the answer."""
        assert self.cluster is not None
        self.cluster.lose_answer = True

    def only_v4(self) -> None:
        assert self.cluster is not None
        self.cluster.protocols = (V4,)

    def end_pod(self, job: str, status: dict[str, Any] | None = None) -> None:
        """The pod of ``job`` killed: deleted (None), or left with ``status``."""

        async def end(c: Cluster) -> None:
            for pod in [p for p in c.pods.values() if p.job == job]:
                await c.delete_pod(pod.name, status=status)

        self.call(end)

    def set_job_status(self, job: str, status: dict[str, Any]) -> None:
        async def put(c: Cluster) -> None:
            key = (JOBS, next(k[1] for k in c.objects._objects if k[2] == job), job)
            current = c.objects[key].raw
            c.objects[key] = {**current, "status": status}

        self.call(put)

    def delete_job(self, job: str) -> None:
        """Someone else deletes the Job (and, with it, its pods)."""

        async def delete(c: Cluster) -> None:
            for key in [k for k in c.objects._objects if k[0].plural == "jobs" and k[2] == job]:
                del c.objects[JOBS, key[1], key[2]]
            for pod in [p for p in c.pods.values() if p.job == job]:
                await c.delete_pod(pod.name)

        self.call(delete)


@contextlib.contextmanager
def fake_cluster(base: Path) -> Iterator[FakeCluster]:
    with FakeCluster(base) as cluster:
        yield cluster
