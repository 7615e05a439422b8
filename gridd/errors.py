"""The one exception tree gridd raises, and how each maps to an HTTP answer.

    GriddError                       code, message, details, status (HTTP)
    ├── ApiError                     anything a client did wrong: a 4xx
    │   ├── BadRequest         400   malformed JSON, unreadable body
    │   ├── NotFound           404   unknown path or id
    │   ├── MethodNotAllowed   405
    │   ├── Conflict           409   the request clashes with current state
    │   ├── PayloadTooLarge    413   a body (or a plan's expansion) over the limit
    │   └── ValidationFailed   422   well-formed but invalid values
    ├── WorkspaceError               no git repository, path too deep for a socket
    ├── ConfigError                  .grid/config.toml is invalid (names the key)
    ├── AlreadyRunning               another gridd (or another program) holds the workspace lock
    ├── StoreError                   the SQLite state cannot be used
    └── DaemonUnreachable            (client side) nothing answers on the socket

Every error carries data (``code``, ``details``) so that the API can render
``{"error": {"code", "message", "details"}}`` and the CLI can print something useful.
``transient`` says whether retrying the same thing later may succeed.
"""

from __future__ import annotations

from typing import Any


class GriddError(Exception):
    """Base of everything gridd raises on purpose."""

    code = "error"
    status = 500
    transient = False

    def __init__(self, message: str, *, code: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details if details is not None else {}

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class ApiError(GriddError):
    """A client error; always rendered with a 4xx status."""

    status = 400


class BadRequest(ApiError):
    code = "bad_request"
    status = 400


class NotFound(ApiError):
    code = "not_found"
    status = 404


class MethodNotAllowed(ApiError):
    code = "method_not_allowed"
    status = 405


class Conflict(ApiError):
    code = "conflict"
    status = 409


class PayloadTooLarge(ApiError):
    code = "payload_too_large"
    status = 413


class ValidationFailed(ApiError):
    code = "validation_failed"
    status = 422


class Forbidden(ApiError):
    code = "forbidden"
    status = 403


class WorkspaceError(GriddError):
    code = "workspace_error"


class ConfigError(GriddError):
    code = "config_invalid"


class AlreadyRunning(GriddError):
    """The workspace lock is held. ``pid``: the pid written in the lock file (what a gridd
    writes once it holds it); ``holder``: when the kernel names a different holder (Linux,
    ``/proc/locks``), its pid and command line, and the message names that process."""

    code = "already_running"

    def __init__(
        self, workspace: str, pid: int | None, *, holder: tuple[int, str] | None = None
    ) -> None:
        details: dict[str, Any] = {"workspace": workspace, "pid": pid}
        if holder is None:
            pid_text = str(pid) if pid is not None else "unknown"
            message = f"gridd is already running for {workspace} (pid {pid_text})"
        else:
            holder_pid, command = holder
            written = f"; the lock file names pid {pid}" if pid is not None else ""
            message = (
                f"gridd cannot start for {workspace}: pid {holder_pid} ({command}) holds"
                f" .grid/gridd.lock{written}. If that is not a gridd serving this workspace,"
                f" end it (kill {holder_pid}) and start gridd again"
            )
            details.update(pid=holder_pid, lockFilePid=pid, holder=command)
            pid = holder_pid
        super().__init__(message, details=details)
        self.pid = pid


class StoreError(GriddError):
    code = "store_error"


#: StoreError codes for a disk that cannot take writes: HTTP 507, the rest 503.
DISK_CODES = frozenset({"disk_full", "disk_read_only"})


class DaemonUnreachable(GriddError):
    code = "daemon_unreachable"
    transient = True
