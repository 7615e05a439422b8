"""The workspace: which git repository gridd serves and where its state lives (``.grid/``)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gridd.errors import WorkspaceError

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
    """The git top level of ``path`` (or the cwd); a clear error outside a repository."""
    start = (path or Path.cwd()).resolve()
    if not start.is_dir():
        raise WorkspaceError(f"not a directory: {start}", details={"path": str(start)})
    try:
        proc = subprocess.run(
            ["git", "-C", str(start), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise WorkspaceError("git is not installed or not on PATH", code="git_missing") from None
    if proc.returncode != 0:
        raise WorkspaceError(
            f"not inside a git repository: {start} (run 'git init' there, or pass --workspace)",
            code="not_a_git_repo",
            details={"path": str(start)},
        )
    return Workspace(root=Path(proc.stdout.strip()).resolve())
