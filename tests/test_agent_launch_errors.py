"""An agent command that cannot start is reported by the name the user wrote in the profile.

``execvpe`` fails with the last PATH entry it tried (``b'/bin/no-such-agent'``), a path the
user never named, in a bytes literal. The shim says instead what is wrong with the command
as written: not found on PATH, a path that does not exist, a file that is not executable, a
script whose interpreter is missing. Each case runs a real shim (``AgentProcess.spawn``).
"""

from __future__ import annotations

from pathlib import Path

from gridd.runs.process import AgentProcess


async def _start_error(tmp_path: Path, command: str, *, path: str) -> str | None:
    run_dir = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    handle = await AgentProcess.spawn(
        run_dir,
        argv=[command, "a prompt"],
        cwd=tmp_path,
        env={"PATH": path},
        stdin="null",
    )
    status = handle.exit_status()
    assert status is not None and status.exit_code == 127
    return status.error


async def test_a_command_not_on_path_is_named_as_written_not_as_the_last_path_tried(
    tmp_path: Path,
) -> None:
    error = await _start_error(tmp_path, "no-such-agent-binary", path="/usr/bin:/bin")
    assert error == "'no-such-agent-binary' not found on PATH"
    log = (tmp_path / "run-0" / "output.log").read_text()
    assert log == "gridd: cannot start agent: 'no-such-agent-binary' not found on PATH\n"


async def test_an_explicit_path_that_does_not_exist_is_named_as_written(tmp_path: Path) -> None:
    error = await _start_error(tmp_path, "./agents/missing.sh", path="/usr/bin:/bin")
    assert error == "'./agents/missing.sh' does not exist"


async def test_a_file_that_is_not_executable_is_named_as_written(tmp_path: Path) -> None:
    (tmp_path / "agent.sh").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "agent.sh").chmod(0o644)
    assert await _start_error(tmp_path, "./agent.sh", path="/bin") == (
        "'./agent.sh' is not executable"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "my-agent").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "my-agent").chmod(0o644)
    assert await _start_error(tmp_path, "my-agent", path=str(bin_dir)) == (
        f"'my-agent' ({bin_dir / 'my-agent'}) is not executable"
    )


async def test_a_script_whose_interpreter_is_missing_says_so_rather_than_not_found(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "my-agent").write_text("#!/no/such/interpreter\n")
    (bin_dir / "my-agent").chmod(0o755)
    assert await _start_error(tmp_path, "my-agent", path=str(bin_dir)) == (
        f"'my-agent' ({bin_dir / 'my-agent'}) names an interpreter in its '#!' line that"
        " does not exist"
    )
