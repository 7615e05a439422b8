"""``gridctl trust``: allow the commands of a committed ``.grid/config.toml`` to run.

It shows which keys name commands, then records the sha256 of the file as it is now (see
``gridd.trust``). It does not need the daemon; a daemon that refused to start because of an
untrusted config starts on the next ``gridctl`` command.
"""

from __future__ import annotations

import argparse
import os

from gridd import trust
from gridd.cli.context import EXIT_ERROR, EXIT_OK, Command, Context


def build_trust(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="only say whether the config is trusted (exit 1 when gridd would refuse it)",
    )


def run_trust(ctx: Context) -> int:
    ws = ctx.workspace
    config = ws.config_path
    if config.is_symlink():
        ctx.note(f"{config} is a symbolic link; gridd does not follow it. Remove it first")
        return EXIT_ERROR
    verdict = trust.assess(ws.root, config, os.environ)
    commands = ", ".join(verdict.commands) or "none"
    if ctx.args.check or not config.exists():
        state = "trusted" if verdict.trusted else "NOT trusted"
        print(f"{config}: {state} ({verdict.reason}); commands: {commands}")
        return EXIT_OK if verdict.trusted else EXIT_ERROR
    sha = trust.record(config, os.environ)
    print(f"trusted {config} (sha256 {sha[:12]}); commands it may run: {commands}")
    print(f"recorded in {trust.trust_file(os.environ)}; any change to the file needs this again")
    return EXIT_OK


TRUST = Command(
    help="trust this repository's committed .grid/config.toml, so gridd runs its commands",
    description="A .grid/config.toml committed to the repository may name commands (agents,"
    " notifications, beads). gridd runs none of them until you have read the file and"
    " trusted it: this records its sha256 in $XDG_STATE_HOME/gridd/trusted.json (default"
    " ~/.local/state/gridd/). A config you wrote yourself (not committed) needs no trust."
    " Any change to the file needs trusting again. --check only reports.",
    build=build_trust,
    run=run_trust,
)
