"""``gridctl completion SHELL``: scripts that load in their shell and complete subcommands."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gridd.cli import completion
from gridd.cli.gridctl import build_parser
from tests.support.cli import gridctl


def complete_in_bash(script: Path, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one being completed), via the script."""
    line = " ".join(words)
    program = f"""
source {script}
COMP_WORDS=({line})
COMP_CWORD={len(words) - 1}
COMP_LINE="{line}"
COMP_POINT=${{#COMP_LINE}}
$(complete -p gridctl | sed -E 's/.*-F ([^ ]+) .*/\\1/') gridctl "{words[-1]}" "{words[-2]}"
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert result.stderr == "", result.stderr
    return [w for w in result.stdout.split() if w]


def test_bash_script_loads_and_completes_subcommands(tmp_path: Path) -> None:
    result = gridctl(tmp_path, "completion", "bash")
    assert result.returncode == 0, result.stderr
    script = tmp_path / "gridctl.bash"
    script.write_text(result.stdout)
    assert complete_in_bash(script, "gridctl", "met") == ["metrics"]
    assert set(complete_in_bash(script, "gridctl", "d")) == {"daemon", "doctor"}
    assert complete_in_bash(script, "gridctl", "daemon", "rest") == ["restart"]
    assert "--raw" in complete_in_bash(script, "gridctl", "metrics", "--r")


def test_completion_needs_no_workspace_or_daemon(tmp_path: Path) -> None:
    result = gridctl(tmp_path, "--no-start", "completion", "zsh")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#compdef gridctl")
    assert not (tmp_path / ".grid").exists()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_parses(tmp_path: Path) -> None:
    script = tmp_path / "_gridctl"
    script.write_text(gridctl(tmp_path, "completion", "zsh").stdout)
    subprocess.run(["zsh", "-n", str(script)], check=True, timeout=30)


def test_fish_script_completes_every_subcommand_and_its_actions(tmp_path: Path) -> None:
    text = gridctl(tmp_path, "completion", "fish").stdout
    lines = text.splitlines()
    top = [line for line in lines if "-n __fish_use_subcommand -a" in line]
    names = {line.split(" -a ")[1].split()[0] for line in top}
    assert {"status", "task", "daemon", "metrics", "completion"} <= names
    assert any(
        "__fish_seen_subcommand_from daemon; and not __fish_seen_subcommand_from" in line
        and "-a restart" in line
        for line in lines
    )
    assert any("completion' -a 'bash zsh fish'" in line for line in lines)
    if shutil.which("fish"):
        script = tmp_path / "gridctl.fish"
        script.write_text(text)
        subprocess.run(["fish", "--no-execute", str(script)], check=True, timeout=30)


def test_unknown_shell_is_a_usage_error(tmp_path: Path) -> None:
    result = gridctl(tmp_path, "completion", "powershell")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_an_alias_is_listed_once_beside_its_command_and_still_runs_it() -> None:
    parser = build_parser()
    listing = parser.format_help()
    assert "task (tasks)" in listing
    assert not any(line.split()[:1] == ["tasks"] for line in listing.splitlines())
    assert parser.parse_args(["tasks", "list"]).action == "list"
    fish = completion.script("fish", parser)
    assert "-a tasks -d" in fish and "-a task -d" in fish
