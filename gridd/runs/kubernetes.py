"""The kubernetes engine: each run's box is a ``batch/v1`` Job (``runs/boxes.py`` ``Engine``).

Through lightkube (the optional extra ``gridd[kubernetes]``), imported on the first call
that needs the cluster, so a daemon whose runs are all elsewhere never loads it.

- **The claim** is creating the Job under the run's name: the API server answers 409 when
  the name is taken, so a run never has two copies. A 403 that names a quota is
  ``QuotaExceeded``: the run has not started, which is not a failure. So is a Job admitted
  whose pod the quota refuses (the Job controller's ``FailedCreate`` Event, no pod): read
  from the Job's Events, once when no pod has appeared ``QUOTA_LOOK_SECONDS`` after the
  create and once more at ``start_timeout_seconds``; the Job is deleted either way, so
  that it cannot start the run later, once the quota has room.
- **A stop while the pod is not yet running** (``abandon``: a cancel while it is being
  scheduled or its image pulled) wakes the start's wait at once: the Job is deleted (its
  pod with it) and the start raises ``StartAbandoned``.
- **The caps hold without the daemon**: ``activeDeadlineSeconds``, CPU and memory requests
  equal to their limits, ``ttlSecondsAfterFinished``, ``backoffLimit: 0`` (gridd owns
  retries), no service-account token in the pod, secrets only by reference, an optional
  ``runtimeClassName``; labels name the workspace, the task and the run.
- **Files in**: the pod's main process is a small bootstrap waiting for ``<root>/.ready``.
  Once the pod runs, one exec writes the in-box shim, the spec and the base bundle (a tar
  of exactly the size it announces: nothing waits for stdin to close), and the bootstrap
  becomes the shim (``runs/boxshim.py`` ``run``). A bootstrap given nothing within
  ``start_timeout_seconds`` exits, so a daemon killed in between leaves no pod waiting;
  restarted, the daemon deletes such a Job at once (``RemoteExecutor.fence``: the run
  directory has no ``remote.in``, written once the run is in).
- **Everything else is an exec** of the shim's commands in the pod (the exec websocket's
  ``v5.channel.k8s.io`` protocol: Kubernetes 1.30 or later).
- **Why a box is gone** is read from the Job and its pod (``exit_reason``): out of memory,
  past its deadline, evicted, its node lost. ``BoxGone`` carries it, and the mirror writes
  it into the run's exit record instead of a bare "lost".
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gridd.errors import Conflict, GriddError
from gridd.runs.boxes import BOXSHIM, BoxError, BoxGone, BoxInfo
from gridd.runs.executor import StartAbandoned
from gridd.runs.podwatch import PodWatch
from gridd.settings import KubernetesSettings

log = logging.getLogger(__name__)

ROOT = "/grid"
CONTAINER = "box"
#: The label on the pod template that finds a box's pod (its Job's name).
BOX_LABEL = "grid.box"
WORKSPACE_LABEL = "grid.workspace"
#: One exec (a look, an answer, the result bundle) may take at most this long.
EXEC_TIMEOUT = 120.0
#: A Job with no pod at all this long after its create: its Events are read once (a quota
#: that refused the pod). A pod merely waiting for a node or its image is there, Pending.
QUOTA_LOOK_SECONDS = 5.0

#: The pod's main process until the daemon has put the run in: then it becomes the shim.
BOOT = """\
import os, sys, time
root, limit = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + limit
while not os.path.exists(os.path.join(root, ".ready")):
    if time.monotonic() > end:
        sys.stderr.write("gridd: the run was never put into this box\\n")
        sys.exit(3)
    time.sleep(0.05)
shim = os.path.join(root, "boxshim.py")
os.execv(sys.executable, [sys.executable, "-I", "-S", shim, "run", root])
"""

#: Exactly <size> bytes of a tar from stdin, unpacked into <root>; then <root>/.ready.
RECEIVE = """\
import io, os, sys, tarfile
root, size = sys.argv[1], int(sys.argv[2])
data = b""
while len(data) < size:
    chunk = sys.stdin.buffer.read(size - len(data))
    if not chunk:
        break
    data += chunk
if len(data) != size:
    sys.stdout.write("short\\n")
    sys.exit(1)
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(root, filter="data")
    else:
        tar.extractall(root)
open(os.path.join(root, ".ready"), "w").close()
sys.stdout.write("ok\\n")
"""


class QuotaExceeded(GriddError):
    """The namespace's ResourceQuota refused the run: it has not started (not a failure)."""

    code = "quota_exceeded"
    transient = True


def k8s_name(box: str) -> str:
    """A box name as a Kubernetes object name (a DNS-1123 label, at most 63): lowercased,
    other characters as '-', and a hash of the original when that changed or cut it."""
    name = re.sub(r"[^a-z0-9-]", "-", box.lower()).strip("-")
    if name == box and len(name) <= 63:
        return name
    digest = hashlib.sha256(box.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-')}-{digest}"


def _label_value(value: str) -> str:
    """Label values: at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", value)
    if clean == value and len(clean) <= 63:
        return clean
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{clean[:54].strip('-_.')}-{digest}"


def job_manifest(
    settings: KubernetesSettings,
    *,
    box: str,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The Job of one run (PURE): every cap of docs/executors.md, nothing from the daemon's
    environment (secrets go by reference)."""
    name = k8s_name(box)
    all_labels = {k: _label_value(v) for k, v in labels.items()} | {BOX_LABEL: name}
    resources = {"cpu": settings.cpu, "memory": settings.memory}
    env = [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": ref[0], "key": ref[1]}}}
        for var, ref in sorted(
            (var, tuple(where.split("/", 1))) for var, where in settings.secret_env.items()
        )
    ]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.image,
        "command": [
            "python3",
            "-I",
            "-S",
            "-c",
            BOOT,
            ROOT,
            str(int(settings.start_timeout_seconds)),
        ],
        "resources": {"requests": resources, "limits": resources},
        "volumeMounts": [{"name": "grid", "mountPath": ROOT}],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if env:
        container["env"] = env
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [{"name": "grid", "emptyDir": {}}],
    }
    if settings.service_account:
        pod["serviceAccountName"] = settings.service_account
    if settings.runtime_class:
        pod["runtimeClassName"] = settings.runtime_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": all_labels,
            "annotations": {"grid.box": box},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.deadline_seconds,
            "ttlSecondsAfterFinished": settings.ttl_seconds,
            "template": {"metadata": {"labels": all_labels}, "spec": pod},
        },
    }


def exit_reason(job: Mapping[str, Any] | None, pods: list[Mapping[str, Any]]) -> tuple[str, str]:
    """Why a box stopped without its shim's exit record (PURE): (reason, what to say).
    Reasons: ``oom_killed``, ``deadline_exceeded``, ``evicted``, ``node_lost``,
    ``box_gone`` (the Job or its pod deleted by someone else, or nothing known)."""
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            state = container.get("state") or {}
            ended = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
            if ended and ended.get("reason") == "OOMKilled":
                return (
                    "oom_killed",
                    f"out of memory: pod {name} reached its memory limit and was killed (OOMKilled)",
                )
        if status.get("reason") == "Evicted":
            why = status.get("message") or "evicted by its node"
            return "evicted", f"evicted: pod {name}: {why}"
        for cond in status.get("conditions") or []:
            if cond.get("type") != "DisruptionTarget" or cond.get("status") != "True":
                continue
            why = cond.get("message") or cond.get("reason") or ""
            if cond.get("reason") in ("DeletionByTaintManager", "PodGC"):
                return "node_lost", f"node lost: pod {name}: {why}"
            return "evicted", f"evicted: pod {name}: {why}"
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    for cond in conditions:
        if cond.get("type") == "Failed" and cond.get("reason") == "DeadlineExceeded":
            return (
                "deadline_exceeded",
                f"deadline exceeded: the Job ran past its activeDeadlineSeconds"
                f" ({(job or {}).get('spec', {}).get('activeDeadlineSeconds')}s)",
            )
    if job is None:
        return "box_gone", "the run's Job is gone (deleted outside gridd)"
    if not pods:
        return "box_gone", "the run's pod is gone (deleted outside gridd, or its node lost)"
    return "box_gone", "the run's pod stopped without an exit record"


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(rel)
            # The spec may carry the profile's keys: the run's user only.
            info.size, info.mode, info.mtime = len(data), 0o600, now
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class KubernetesEngine:
    kind = "kubernetes"
    root = ROOT
    input_after_create = True  # the Job first (the claim), the run by exec once its pod runs

    def __init__(self, settings: KubernetesSettings, *, client: Any = None) -> None:
        self.settings = settings
        self._client = client
        self._client_lock = threading.Lock()
        self._pods: dict[str, str] = {}  # box -> its pod's name, once known
        self._nodes: dict[str, str] = {}  # box -> its pod's node, once scheduled
        self._watch: PodWatch | None = None  # the workspace's pods: one watch, at first use
        self._watch_lock = threading.Lock()
        self._starting: set[str] = set()  # boxes whose create is under way
        self._abandoned: set[str] = set()  # of those, the ones a stop gave up
        self._starts_lock = threading.Lock()
        #: API requests made, by verb (the benchmark's count).
        self.requests: dict[str, int] = {}

    # -- the client ---------------------------------------------------------------------

    def client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                self._client = _connect(self.settings)
            _prepare_models()
            return self._client

    def _count(self, verb: str) -> None:
        self.requests[verb] = self.requests.get(verb, 0) + 1

    # -- the engine ---------------------------------------------------------------------

    def create(
        self,
        name: str,
        *,
        labels: dict[str, str],
        files: dict[str, bytes],
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """The Job, with the profile's ``options`` (``[agents.<name>.kubernetes]``) over
        ``[executors.kubernetes]``."""
        settings = self.settings.model_copy(update=dict(options or {}))
        if not settings.image:
            raise GriddError(
                "the kubernetes executor needs an image: set [executors.kubernetes] image"
                " (build one from contrib/kubernetes/Dockerfile)",
                code="config_invalid",
            )
        manifest = job_manifest(settings, box=name, labels=labels)
        with self._starts_lock:
            self._starting.add(name)
        try:
            self._create(name, manifest, labels=labels, files=files)
        finally:
            with self._starts_lock:
                self._starting.discard(name)
                self._abandoned.discard(name)

    def _create(
        self,
        name: str,
        manifest: dict[str, Any],
        *,
        labels: Mapping[str, str],
        files: dict[str, bytes],
    ) -> None:
        from lightkube import codecs

        self._check_abandoned(name)
        try:
            self._count("create")
            client = self.client()  # first: it makes the models ready (_prepare_models)
            client.create(codecs.from_dict(manifest), namespace=self.settings.namespace)
        except Exception as exc:
            refusal = api_status(exc)
            if refusal is None:  # no answer: unreachable, or made and the answer lost
                self._remove_unanswered(name)
                raise BoxError(f"could not create the Job of box {name}: {exc!r}") from exc
            raise _create_error(*refusal, name) from None
        try:
            self._wait_running(name, labels)
            files = {"boxshim.py": BOXSHIM.read_bytes(), **files}
            data = _tar(files)
            answer = self._exec_raw(
                name, ["python3", "-I", "-S", "-c", RECEIVE, ROOT, str(len(data))], stdin=data
            )
            if answer.strip() != b"ok":
                raise BoxError(f"box {name}: the run was not taken in ({answer[-200:]!r})")
            # A stop during the put-in: the agent is not seen to run yet; it goes with its Job.
            self._check_abandoned(name)
        except GriddError:
            self.remove(name)
            raise

    def _remove_unanswered(self, name: str) -> None:
        """A create that got no answer (a read timed out) may still have made the Job: it is
        deleted, or its pod would wait ``start_timeout_seconds`` for a run never put in and
        the Job hold its share of the quota until ``ttl_seconds``."""
        try:
            self.remove(name)
        except BoxError as exc:
            log.warning("the Job of box %s may be left (its create went unanswered): %s", name, exc)

    def abandon(self, name: str) -> None:
        """A stop came while the box may be starting: a create under way gives up at once
        (its wait for the pod is woken), deletes the Job and raises ``StartAbandoned``."""
        with self._starts_lock:
            if name not in self._starting:
                return  # not (or no longer) being created: nothing to give up
            self._abandoned.add(name)
        watch = self._watch
        if watch is not None:
            watch.wake()

    def _check_abandoned(self, name: str) -> None:
        if name in self._abandoned:
            raise StartAbandoned(
                f"box {name}: its start was given up (stopped before its pod ran the agent)",
                details={"box": name},
            )

    def pod_watch(self, labels: Mapping[str, str]) -> PodWatch:
        """The one watch on the workspace's pods (by its label, from the first box's)."""
        with self._watch_lock:
            if self._watch is None:
                scope = {k: _label_value(v) for k, v in labels.items() if k == WORKSPACE_LABEL}
                self._watch = PodWatch(
                    self.client,
                    namespace=self.settings.namespace,
                    labels=scope,
                    box_label=BOX_LABEL,
                    opened=lambda: self._count("watch"),
                )
            return self._watch

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def _wait_running(self, name: str, labels: Mapping[str, str]) -> str:
        """The box's pod, once it runs (the scheduler placed it and the image is pulled):
        told by the workspace's watch, no request of its own. ``StartAbandoned`` when a
        stop comes first; ``QuotaExceeded`` when no pod came because the quota refused it
        (its Job's Events, read when no pod has appeared ``QUOTA_LOOK_SECONDS`` after the
        create, and at the deadline)."""
        timeout = self.settings.start_timeout_seconds
        watch, box = self.pod_watch(labels), k8s_name(name)
        end = time.monotonic() + timeout

        def stop() -> bool:
            return name in self._abandoned

        pod = watch.wait(box, _any, min(QUOTA_LOOK_SECONDS, timeout), stop=stop)
        self._check_abandoned(name)
        if pod is None:
            self._check_quota(name)
        pod = watch.wait(box, _started, max(end - time.monotonic(), 0.0), stop=stop)
        self._check_abandoned(name)
        if pod is None and timeout > QUOTA_LOOK_SECONDS:
            self._check_quota(name)
        phase = ((pod or {}).get("status") or {}).get("phase")
        if phase == "Running":
            assert pod is not None
            self._pods[name] = str(pod["metadata"]["name"])
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                self._nodes[name] = str(node)
            return self._pods[name]
        if phase in ("Succeeded", "Failed"):
            raise self._gone(name)
        raise BoxError(
            f"the pod of box {name} did not run within {timeout:g}s ({phase or 'no pod yet'})"
        )

    def _check_quota(self, name: str) -> None:
        """``QuotaExceeded`` when the Job controller was refused the Job's pod by a quota
        (a ``FailedCreate`` Event on the Job saying so): one list of the Job's Events."""
        from lightkube.resources.core_v1 import Event

        job = k8s_name(name)
        self._count("list")
        try:
            items = self.client().list(
                Event, namespace=self.settings.namespace, fields={"involvedObject.name": job}
            )
            events = [_as_dict(item) for item in items]
        except Exception as exc:  # a courtesy: the start waits on as before
            log.warning("could not read the Events of the Job of box %s: %r", name, exc)
            return
        refusal = quota_refusal(events, job)
        if refusal is not None:
            raise QuotaExceeded(
                f"the namespace's quota refused the run's pod (not started): {refusal}",
                details={"box": name},
            )

    def _list(self, kind: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Objects of ``kind`` (``Pod``, ``Job``) carrying ``labels``, found by the server's
        label selector. ``BoxError`` when the API cannot be reached."""
        from lightkube.resources import batch_v1, core_v1

        resource = core_v1.Pod if kind == "Pod" else batch_v1.Job
        self._count("list")
        try:
            items = self.client().list(resource, namespace=self.settings.namespace, labels=labels)
            found = [_as_dict(item) for item in items]
        except Exception as exc:
            raise BoxError(f"could not list {kind}s: {exc!r}") from exc
        # The selector is the server's to apply; a test double may not: checked here too.
        return [
            obj
            for obj in found
            if all(
                ((obj.get("metadata") or {}).get("labels") or {}).get(k) == v
                for k, v in labels.items()
            )
        ]

    def _find_pod(self, name: str) -> dict[str, Any] | None:
        pods = self._list("Pod", {BOX_LABEL: k8s_name(name)})
        if not pods:
            return None
        self._pods[name] = pods[0]["metadata"]["name"]
        return pods[0]

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        shim = ["python3", "-I", "-S", f"{ROOT}/boxshim.py", args[0], ROOT, *args[1:]]
        return self._exec_raw(name, shim, stdin=stdin)

    def _exec_raw(self, name: str, command: list[str], *, stdin: bytes) -> bytes:
        pod = self._pods.get(name)
        if pod is None:
            found = self._find_pod(name)
            if found is None:
                raise self._gone(name)
            pod = str(found["metadata"]["name"])
        try:
            self._count("exec")
            done = self.client().exec(
                pod,
                namespace=self.settings.namespace,
                container=CONTAINER,
                command=command,
                stdin=stdin or None,
                stdout=True,
                stderr=True,
                decode=None,
                timeout=EXEC_TIMEOUT,
            )
        except Exception as exc:
            if "supports writing to stdin" in str(exc):
                raise GriddError(
                    "the API server's exec speaks only v4.channel.k8s.io; gridd's run"
                    " protocol needs v5.channel.k8s.io (Kubernetes 1.30 or later)",
                    code="exec_protocol",
                    details={"box": name},
                ) from None
            # Refused (the pod is not there or does not run), or the connection broke:
            # gone when the pod says so, else worth another try at the next look.
            if self._stopped(name):
                raise self._gone(name) from None
            raise BoxError(f"box {name}: exec failed: {exc!r}", details={"box": name}) from exc
        if done.exit_code != 0:
            err = (done.stderr or b"").decode(errors="replace")[-500:]
            raise BoxError(
                f"box {name}: {command[4] if len(command) > 4 else command[0]} failed"
                f" ({done.exit_code}): {err}",
                details={"box": name},
            )
        return bytes(done.stdout or b"")

    def _stopped(self, name: str) -> bool:
        try:
            pod = self._find_pod(name)
        except BoxError:
            return False  # cannot tell: not gone
        phase = ((pod or {}).get("status") or {}).get("phase")
        return pod is None or phase in ("Succeeded", "Failed")

    def _job(self, name: str) -> dict[str, Any] | None:
        from lightkube.resources.batch_v1 import Job

        try:
            self._count("get")
            job = self.client().get(Job, k8s_name(name), namespace=self.settings.namespace)
            return _as_dict(job)
        except Exception as exc:
            answer = api_status(exc)
            if answer is not None and answer[0] == 404:
                return None
            raise BoxError(f"could not read the Job of box {name}: {exc!r}") from None

    def _gone(self, name: str) -> BoxGone:
        """The box stopped or went: why, from its Job and its pod."""
        try:
            job = self._job(name)
            pod = self._find_pod(name)
        except Exception as exc:  # the reason is a courtesy: gone is gone
            log.warning("could not tell why box %s is gone: %s", name, exc)
            job, pod = None, None
        reason, message = exit_reason(job, [pod] if pod else [])
        return BoxGone(message, details={"box": name, "reason": reason})

    def where(self, name: str) -> dict[str, str]:
        """The Job's pod and the node the scheduler put it on (``spec.nodeName``), as seen
        when it started to run; nothing of either not seen."""
        place = {"pod": self._pods.get(name), "node": self._nodes.get(name)}
        return {k: v for k, v in place.items() if v}

    def find(self, labels: dict[str, str]) -> list[BoxInfo]:
        wanted = {k: _label_value(v) for k, v in labels.items()}
        return [_info(job) for job in self._list("Job", wanted)]

    def info(self, name: str) -> BoxInfo | None:
        job = self._job(name)
        return None if job is None else _info(job)

    def remove(self, name: str) -> None:
        """Delete the Job and, through the garbage collector, its pod (Background)."""
        from lightkube.resources.batch_v1 import Job
        from lightkube.types import CascadeType

        self._pods.pop(name, None)
        self._nodes.pop(name, None)
        try:
            self._count("delete")
            self.client().delete(
                Job,
                k8s_name(name),
                namespace=self.settings.namespace,
                grace_period=0,
                cascade=CascadeType.BACKGROUND,
            )
        except Exception as exc:
            answer = api_status(exc)
            if answer is None or answer[0] != 404:
                raise BoxError(f"could not delete the Job of box {name}: {exc!r}") from None


def quota_refusal(events: Sequence[Mapping[str, Any]], job: str) -> str | None:
    """What the Job controller was told when a quota refused the pod of ``job`` (PURE): the
    message of a ``FailedCreate`` Event on the Job that names a quota, or None."""
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("name") != job or involved.get("kind", "Job") != "Job":
            continue  # the selector is the server's to apply; a test double may not
        message = str(event.get("message") or "")
        if event.get("reason") == "FailedCreate" and "exceeded quota" in message.lower():
            return message
    return None


def _any(pod: Mapping[str, Any]) -> bool:
    """Any pod at all: the Job controller made one."""
    return True


def _started(pod: Mapping[str, Any]) -> bool:
    """Running, or ended before it ran: either way no more waiting."""
    return (pod.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")


def _info(job: Mapping[str, Any]) -> BoxInfo:
    meta = job.get("metadata") or {}
    conditions = (job.get("status") or {}).get("conditions") or []
    finished = any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )
    box = (meta.get("annotations") or {}).get("grid.box") or meta.get("name", "")
    return BoxInfo(box, not finished, dict(meta.get("labels") or {}))


def api_status(exc: BaseException) -> tuple[int, str] | None:
    """The API server's answer in ``exc`` (its HTTP status and the Status's message), or
    None when none came (the connection failed). lightkube raises ``ApiError`` for a JSON
    Status and the plain HTTP error otherwise: both are read here."""
    status = getattr(exc, "status", None)
    code = getattr(status, "code", None)
    if isinstance(code, int):
        return code, str(getattr(status, "message", None) or exc)
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    if not isinstance(code, int):
        return None
    try:
        message = str(response.json().get("message") or "")  # type: ignore[union-attr]
    except Exception:
        message = ""
    return code, message or str(exc)


def _create_error(code: int, message: str, name: str) -> GriddError:
    if code == 409:
        return Conflict(f"the Job of box {name} exists", code="box_exists")
    if code == 403 and "quota" in message.lower():
        return QuotaExceeded(
            f"the namespace's quota refused the run (not started): {message}",
            details={"box": name},
        )
    return BoxError(f"could not create the Job of box {name}: {message}", details={"box": name})


def _as_dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else dict(obj.to_dict())


_models_lock = threading.Lock()
_models_ready = False


def _prepare_models() -> None:
    """Build msgspec's type information of every lightkube model the engine decodes or
    converts, once per process, on one thread. msgspec (0.22) builds a Struct type's
    information lazily at its first decode or convert, and two threads doing that first
    decode at once (two runs' ``create``, the pod watch, a mirror's look) crash the process
    with a segmentation fault; once built, concurrent use is safe."""
    global _models_ready
    with _models_lock:
        if _models_ready:
            return
        import msgspec
        from lightkube.core import decoders
        from lightkube.models import meta_v1
        from lightkube.resources import batch_v1, core_v1

        for resource in (batch_v1.Job, core_v1.Pod, core_v1.Event):
            msgspec.json.Decoder(resource)
            decoders.decode_list(b'{"items": []}', resource)  # its list model, made once
        msgspec.json.Decoder(meta_v1.Status)
        decoders.decode_watch_event(b'{"type": "ADDED", "object": {}}')
        _models_ready = True


def _connect(settings: KubernetesSettings) -> Any:
    try:
        from lightkube import Client, KubeConfig
        from lightkube.config.models import Cluster, User
    except ImportError as exc:
        raise GriddError(
            "the kubernetes executor needs lightkube: pip install 'gridd[kubernetes]'",
            code="config_invalid",
        ) from exc
    if settings.server:  # as is, no credentials: kubectl proxy, a test's stand-in
        config = KubeConfig.from_one(
            cluster=Cluster(server=settings.server), user=User(), namespace=settings.namespace
        )
    elif settings.kubeconfig:
        config = KubeConfig.from_file(settings.kubeconfig)
    else:
        config = KubeConfig.from_env()
    if settings.context:
        return Client(config.get(context_name=settings.context), namespace=settings.namespace)
    return Client(config, namespace=settings.namespace)
