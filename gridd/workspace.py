"""The workspace: which git repository gridd serves and where its state lives (``.grid/``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gridd.errors import WorkspaceError

#: What git calls its repository-local environment (``git rev-parse --local-env-vars``): set,
#: they choose the repository and index every git command works on, wherever it runs.
GIT_REPOSITORY_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_CONFIG",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS",
    "GIT_DIR",
    "GIT_GRAFT_FILE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_OBJECT_DIRECTORY",
    "GIT_PREFIX",
    "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE",
    "GIT_WORK_TREE",
)


def forget_inherited_git_repository() -> list[str]:
    """Drop the repository git chose for whoever started us. Started from a git hook, an
    alias or ``git bisect run``, a process inherits ``GIT_DIR`` and its kin, and every git
    call of gridd's, and of its agents, would then act on that repository, not on the
    workspace found from the directory. Returns the names dropped (for a log line)."""
    return [name for name in GIT_REPOSITORY_ENV if os.environ.pop(name, None) is not None]


#: sun_path is 108 bytes on Linux (104 on macOS) including the terminating NUL.
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" else 107


@dataclass(frozen=True)
class Workspace:
    """Paths of one workspace's state directory."""

    root: Path

    @property
    def grid_dir(self) -> Path:
        return self.root / ".grid"

    @property
    def socket_path(self) -> Path:
        return self.grid_dir / "gridd.sock"

    @property
    def pid_path(self) -> Path:
        return self.grid_dir / "gridd.pid"

    @property
    def lock_path(self) -> Path:
        return self.grid_dir / "gridd.lock"

    @property
    def log_path(self) -> Path:
        return self.grid_dir / "gridd.log"

    @property
    def db_path(self) -> Path:
        return self.grid_dir / "gridd.db"

    @property
    def config_path(self) -> Path:
        return self.grid_dir / "config.toml"

    @property
    def worktrees_dir(self) -> Path:
        return self.grid_dir / "worktrees"

    @property
    def runs_dir(self) -> Path:
        return self.grid_dir / "runs"

    @property
    def stop_file(self) -> Path:
        return self.grid_dir / "STOP"

    def check_socket_path(self) -> None:
        """Refuse a workspace whose socket path would not fit in ``sun_path``."""
        length = len(os.fsencode(self.socket_path))
        if length > SOCKET_PATH_MAX:
            raise WorkspaceError(
                f"workspace path too deep for a Unix socket: {self.socket_path} is {length} bytes,"
                f" the limit is {SOCKET_PATH_MAX}; move the repository to a shorter path",
                code="socket_path_too_long",
                details={"path": str(self.socket_path), "length": length, "limit": SOCKET_PATH_MAX},
            )

    def ensure_grid_dir(self) -> None:
        """Create ``.grid/`` with mode 0700 (and tighten it if it exists looser); refuse
        symlinks for it and for everything gridd writes inside it."""
        self.refuse_symlinks()
        try:
            self.grid_dir.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.grid_dir, 0o700)
        except FileExistsError:
            raise WorkspaceError(
                f"{self.grid_dir} exists and is not a directory; gridd keeps its state there",
                code="grid_dir_occupied",
                details={"path": str(self.grid_dir)},
            ) from None
        except OSError as exc:
            raise WorkspaceError(
                f"cannot create the state directory {self.grid_dir}: {exc.strerror}",
                details={"path": str(self.grid_dir)},
            ) from None

    def written_paths(self) -> list[Path]:
        """What gridd creates or writes under ``.grid/`` (a symlink there is refused)."""
        db = self.db_path
        return [
            self.log_path,
            *(self.log_path.with_name(f"{self.log_path.name}.{n}") for n in range(1, 10)),
            db,
            *(db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", ".id")),
            self.runs_dir,
            self.worktrees_dir,
            self.pid_path,
            self.lock_path,
            self.socket_path,
            self.grid_dir / "gridd.out",
            self.grid_dir / "gridd.out.1",
        ]

    def refuse_symlinks(self) -> None:
        """A symlinked ``.grid``, log, database, ``runs/`` or ``worktrees/`` would make gridd
        write outside the repository (a cloned repository can ship such links): refuse."""
        for path in [self.grid_dir, *self.written_paths()]:
            if path.is_symlink():
                raise WorkspaceError(
                    f"{path} is a symbolic link; gridd refuses to write through links under"
                    f" .grid/ (it could write outside the repository). Remove it"
                    f" (rm {path}) and start gridd again",
                    code="symlink_refused",
                    details={"path": str(path)},
                )
            if path == self.grid_dir and not path.exists():
                return


def find_workspace(path: Path | None = None) -> Workspace:
    """The workspace holding ``path`` (or the cwd); a clear error outside a repository.

    That is the git top level, except in a worktree gridd made for a task
    (``<root>/.grid/worktrees/<task>``) or for merging (``<root>/.grid/integration``, and
    ``integration-<n>`` for the merge train's candidates gated at once):
    agents and gate checks run there and may call ``gridctl``, which must reach the daemon
    at ``<root>``, not start another one. A worktree the user added anywhere else is a
    workspace of its own, as any other checkout is.
    """
    start = _resolved(path or Path.cwd())
    if not start.is_dir():
        raise WorkspaceError(f"not a directory: {start}", details={"path": str(start)})
    top = _git_path(start, "--show-toplevel")
    if top is None:
        raise WorkspaceError(
            f"not inside a git repository: {start} (run 'git init' there, or pass --workspace)",
            code="not_a_git_repo",
            details={"path": str(start)},
        )
    return Workspace(root=_owner_of_grid_worktree(top) or top)


def _owner_of_grid_worktree(top: Path) -> Path | None:
    """The root whose ``.grid/`` holds the worktree ``top``, when ``top`` is shaped like one
    of gridd's and git agrees that it is a linked worktree of the repository at that root
    (a directory merely named so, or a separate repository there, is left alone)."""
    if top.parent.name == "worktrees" and top.parent.parent.name == ".grid":
        root = top.parent.parent.parent
    elif re.fullmatch(r"integration(-[0-9]+)?", top.name) and top.parent.name == ".grid":
        root = top.parent.parent
    else:
        return None
    if _git_path(root, "--show-toplevel") != root:
        return None
    common = _git_path(top, "--git-common-dir")
    if common is None or common != _git_path(root, "--git-common-dir"):
        return None
    return root


def _git_path(where: Path, flag: str) -> Path | None:
    """``git rev-parse <flag>`` run in ``where``, as an absolute resolved path (None when
    git says no: not a repository, or one it cannot read)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(where), "rev-parse", flag],
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        raise WorkspaceError("git is not installed or not on PATH", code="git_missing") from None
    # Bytes, decoded as the file system does: a directory name need not be UTF-8.
    out = os.fsdecode(proc.stdout.removesuffix(b"\n"))
    if proc.returncode != 0 or not out:
        return None
    # --git-common-dir may answer relative to ``where``; a top level is always absolute.
    return _resolved(where / out)


def _resolved(path: Path) -> Path:
    """``path`` made absolute with its links followed; a loop of links is a clear error."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a loop (Python < 3.13)
        raise WorkspaceError(
            f"cannot resolve the workspace path {path}: {exc}", details={"path": str(path)}
        ) from None
