"""``gridctl init``: a first configuration and a sample plan for a repository.

It writes ``.grid/config.toml`` (commented: the default agent, how to switch it to Claude
Code, a ``claude`` profile to edit; and the ``claude`` profile's sandbox, turned on as far
as this machine's kernel can enforce it: ``sandbox_section``) and ``plan.yaml`` at the
repository's root (three tasks, one depending on the other two), then says what to run next. A file that exists is
never overwritten: it is named and left as it is. It needs no daemon and starts none.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from gridd.cli.context import EXIT_ERROR, EXIT_OK, Command, Context
from gridd.runs import landlock

HEAD = """\
# gridd's configuration for this repository. Every key and its default:
# docs/configuration.md. gridd reads this file when it starts; after a change run
# 'gridctl daemon restart' (it checks the file first and keeps the running daemon if
# the new one would refuse it). Keys left out keep their defaults.

[scheduler]
# The agent profile a task runs when it names none (a task's 'agent:' field picks one).
# The default, "example", is gridd's bundled stand-in agent: it needs nothing installed
# and writes and commits a notes file about its prompt, enough to watch gridd work.
# To run Claude Code for every task instead ('claude' on PATH and logged in), use:
# default_agent = "claude"

# How many agents work at once (a session's --max-agents overrides it).
max_agents = 3

# A session stops starting agents once it has spent this much (USD, default 50; an
# agent that reports no cost counts its profile's cost_per_session). 'gridctl session
# start --budget USD' overrides it.
# budget_usd = 20.0

# The "claude" profile exists without this section; uncomment it to change how Claude
# Code runs: the permission mode, the tools it may use without asking, a time limit.
# A permission request it makes becomes a question: 'gridctl questions', 'gridctl answer'.
# [agents.claude]
# command = ["claude", "-p", "--output-format", "stream-json", "--input-format", "stream-json", "--verbose", "--permission-prompt-tool", "stdio"]
# adapter = "claude"
# adapter_options = { permission_prompt_tool = "stdio", permission_mode = "acceptEdits", allowed_tools = ["Bash(git diff:*)"] }
# cost_per_session = 2.0
# timeout_seconds = 3600
"""

#: The claude profile's sandbox, as ``sandbox_section`` writes it for a kernel that
#: enforces all of it.
SANDBOX = """\
[agents.claude.sandbox]
mode = "workspace"
network = "allowlist"
allow_hosts = ["api.anthropic.com", "platform.claude.com"]
"""


def sandbox_section(abi: int) -> str:
    """The claude profile's sandbox for a kernel of Landlock ``abi`` (0: none): on as far
    as the kernel can enforce it, since a run whose sandbox it cannot enforce does not
    start (``sandbox_unavailable``); what it cannot is left commented, saying why."""
    offers = f"this one offers ABI {abi}" if abi else "this machine has none"
    about = f"""\
# Claude Code's sandbox, enforced by the kernel (Linux Landlock; {offers};
# 'gridctl doctor' says what it enforces): Claude (and all it starts) writes only its
# worktree, a private TMPDIR and its own state (~/.claude/, ~/.claude.json), cannot read
# ~/.ssh, ~/.aws, ~/.gnupg, ~/.config/gh nor .grid/, and commits in a repository of its
# own (its branch comes back when it ends). With network = "allowlist" it reaches only
# allow_hosts (the API; where a subscriber's login is refreshed), through a proxy gridd
# runs; a refused host is an agent.sandbox_denied event ('gridctl logs'). mode = "off"
# turns it all off. Every key: docs/configuration.md, [agents.<name>.sandbox].
"""
    mode, network, hosts = SANDBOX.splitlines()[1:]
    if abi >= landlock.NET_ABI:
        return about + SANDBOX
    if abi >= landlock.MIN_ABI:
        return (
            about + f"# Its network is left as it is: this kernel has no TCP rules (Landlock ABI"
            f" {landlock.NET_ABI},\n# Linux 6.7). On a newer one, uncomment these two lines.\n"
            + f"[agents.claude.sandbox]\n{mode}\n# {network}\n# {hosts}\n"
        )
    return (
        about
        + "# Off here: this machine has no Landlock (Linux 5.13 or newer, with landlock in the\n"
        "# kernel's lsm= list), and a sandbox it cannot enforce would stop every Claude run\n"
        "# from starting. On a machine that has it, uncomment these lines. On macOS gridd\n"
        "# enforces them with sandbox-exec instead, untested so far: uncomment them to try.\n"
        + "".join(f"# {line}\n" for line in SANDBOX.splitlines())
    )


def config_text(abi: int) -> str:
    """The ``.grid/config.toml`` that ``init`` writes on a kernel of Landlock ``abi``."""
    return HEAD + "\n" + sandbox_section(abi)


PLAN = """\
# A plan: tasks with dependencies, loaded at once with 'gridctl plan apply plan.yaml'.
# Every field: docs/plans.md. Each task runs in its own worktree and branch (grid/<id>)
# and comes back for review; a task starts once every task it depends on is done.
tasks:
  - id: usage
    title: Document how to run the project
    prompt: |
      Add a "Usage" section to README.md: how to install the project and run it.
    priority: 1          # 0 (highest) to 4; ready tasks start in priority order

  - id: contributing
    title: Write a contributing guide
    prompt: Write CONTRIBUTING.md saying how to set up, test and send a change.
    files: [CONTRIBUTING.md]   # what it expects to change (the conflict radar)

  - id: docs-links
    title: Link the guides from the README
    prompt: Link CONTRIBUTING.md from the README's Usage section.
    depends_on: [usage, contributing]   # starts once both are approved and merged
"""


def _has_commit(root: str) -> bool:
    result = subprocess.run(
        ["git", "-C", root, "rev-parse", "--verify", "--quiet", "HEAD"],
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def _write_new(path: str, text: str, *, mode: int) -> bool:
    """Write ``text`` to a new file; False (and nothing written) when it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return True


def build_init(parser: argparse.ArgumentParser) -> None:
    del parser  # no options of its own: --workspace picks the repository


def run_init(ctx: Context) -> int:
    ws = ctx.workspace
    ws.ensure_grid_dir()
    root = ws.root
    wrote: list[str] = []
    kept: list[str] = []
    abi = landlock.abi_version()
    for path, text, mode in (
        (ws.config_path, config_text(abi), 0o600),
        (root / "plan.yaml", PLAN, 0o644),
    ):
        shown = os.path.relpath(path, root)
        (wrote if _write_new(str(path), text, mode=mode) else kept).append(shown)
    for shown in kept:
        print(f"gridctl: {shown} exists; left as it is", file=sys.stderr)
    if not wrote:
        return EXIT_ERROR
    print(f"wrote {' and '.join(wrote)} in {root}")
    print()
    print("next:")
    if not _has_commit(str(root)):
        print("  git commit --allow-empty -m start          # tasks branch from a commit")
    print("  gridctl plan apply plan.yaml               # load the sample tasks (edit them first)")
    print("  gridctl session start --branch try-gridd   # agents start; approved work lands there")
    print(
        "  gridctl status --watch                     # follow them, then: gridctl task approve ID"
    )
    print(
        "The agent is the bundled example one; for Claude Code set default_agent ="
        ' "claude" in .grid/config.toml.'
    )
    if os.path.relpath(ws.config_path, root) in wrote:
        print(_sandbox_note(abi))
    return EXIT_OK


def _sandbox_note(abi: int) -> str:
    if abi >= landlock.NET_ABI:
        return (
            "Claude Code's profile is sandboxed: it writes only its worktree and its own"
            " state, and reaches only the API."
        )
    if abi >= landlock.MIN_ABI:
        return (
            "Claude Code's profile is sandboxed (it writes only its worktree and its own"
            f" state); its network is not limited: this kernel's Landlock (ABI {abi}) has no"
            " TCP rules."
        )
    return (
        "This machine has no Landlock: Claude Code's sandbox is left commented out in"
        " .grid/config.toml ('gridctl doctor' says why)."
    )


INIT = Command(
    help="write a commented .grid/config.toml and a sample plan.yaml to start from",
    description="Write .grid/config.toml (commented: the default agent, how to make Claude"
    " Code the default, a claude profile to edit) and a sample plan.yaml at the repository's"
    " root, then say what to run next. An existing file is left as it is (exit 1 when both"
    " exist). Needs no daemon.",
    build=build_init,
    run=run_init,
)
