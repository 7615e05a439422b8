"""``gridd``: run the workspace daemon in the foreground (what a service unit runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gridd import __version__


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
    parser.add_argument("--version", action="version", version=f"gridd {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from gridd.daemon import run

    return run(args.workspace)


if __name__ == "__main__":
    sys.exit(main())
