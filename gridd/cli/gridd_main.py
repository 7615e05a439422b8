"""``gridd``: run the workspace daemon in the foreground (what a service unit runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gridd import __version__
from gridd.workspace import forget_inherited_git_repository


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gridd",
        description="Run the gridd daemon for a git workspace, in the foreground. It listens on"
        " <workspace>/.grid/gridd.sock and logs to stderr and .grid/gridd.log.",
    )
    parser.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="a path inside the git repository (default: cwd)",
    )
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="run attached to this terminal (the default; accepted for service units)",
    )
    parser.add_argument(
        "--check-state",
        action="store_true",
        help="do not run: check, read-only, that this gridd can use the workspace's database"
        " (integrity, schema version); print a JSON report, exit 0 if it can, 1 if not."
        " Safe while another gridd serves the workspace (an upgrade runs it first)",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="do not run: check that this gridd could start with the workspace's"
        " .grid/config.toml (values, agent adapters, trust of its commands); print the"
        " problem and exit 1, or exit 0. Safe while another gridd serves the workspace"
        " ('gridctl daemon restart' and 'upgrade' run it first)",
    )
    parser.add_argument("--version", action="version", version=f"gridd {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    forget_inherited_git_repository()  # before the workspace is found from the directory
    if args.check_state:
        return check_state(args.workspace)
    if args.check_config:
        return check_config(args.workspace)
    from gridd.lean import without_pydantic_plugins

    without_pydantic_plugins()  # before the daemon's first pydantic model
    from gridd.daemon import run

    return run(args.workspace)


def check_config(workspace: Path | None) -> int:
    from gridd.daemon import check_startup_config
    from gridd.errors import GriddError
    from gridd.workspace import find_workspace

    try:
        ws = find_workspace(workspace)
        check_startup_config(ws)
    except GriddError as exc:
        print(f"gridd: {exc.message}", file=sys.stderr)
        return 1
    found = ws.config_path.exists()
    print(f"gridd: {ws.config_path}: {'ok' if found else 'none, all defaults'}")
    return 0


def check_state(workspace: Path | None) -> int:
    import json

    from gridd.errors import GriddError
    from gridd.statecheck import check_state as check
    from gridd.workspace import find_workspace

    try:
        ws = find_workspace(workspace)
    except GriddError as exc:
        print(f"gridd: {exc.message}", file=sys.stderr)
        return 1
    report = check(ws.db_path)
    print(json.dumps(report.as_dict(), indent=2))
    if not report.readable:
        print(f"gridd: {report.problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
