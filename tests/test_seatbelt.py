"""The macOS sandbox's profile (``runs/seatbelt.py``), read as text: no Mac here, so no
process runs under it. A small reader turns the SBPL into nested lists, so each test checks
the profile is well formed and asserts on its rules, not on its spelling. The shim's use of
it on Darwin is checked with a stand-in for ``sandbox-exec`` that records how it was called.
"""

from __future__ import annotations

import json
import marshal
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from gridd.runs import seatbelt
from gridd.runs.sandbox import sandbox_for
from gridd.settings import SandboxSettings

Sexp = list[Any]
TOKEN = re.compile(r'\s*(?:(\()|(\))|#"((?:[^"\\]|\\.)*)"|"((?:[^"\\]|\\.)*)"|([^\s()"]+))')


def read(text: str) -> list[Sexp]:
    """SBPL's forms: a list per parenthesis, strings as ('str', value), regexes as ('re',
    value), anything else as the atom's text. Fails on unbalanced parentheses or a stray
    character: a profile sandbox-exec could not parse."""
    stack: list[Sexp] = [[]]
    pos = 0
    while pos < len(text.rstrip()):
        match = TOKEN.match(text, pos)
        assert match is not None, f"cannot read the profile at {text[pos : pos + 40]!r}"
        pos = match.end()
        opened, closed, regex, string, atom = match.groups()
        if opened:
            stack.append([])
        elif closed:
            assert len(stack) > 1, "a ')' closes nothing"
            done = stack.pop()
            stack[-1].append(done)
        elif regex is not None:
            stack[-1].append(("re", regex))
        elif string is not None:
            stack[-1].append(("str", re.sub(r"\\(.)", r"\1", string)))
        else:
            stack[-1].append(atom)
    assert len(stack) == 1, "a '(' is never closed"
    return stack[0]


def rules(forms: list[Sexp], action: str, operation: str) -> list[Sexp]:
    """The filters of every ``(action ... operation ...)`` form."""
    return [
        [f for f in form[1:] if isinstance(f, list)]
        for form in forms
        if form[0] == action and operation in form[1:]
    ]


def strings(filters: list[Sexp], kind: str) -> list[str]:
    return [f[1][1] for f in filters if f[0] == kind]


def box(tmp_path: Path, **settings: Any) -> dict[str, object]:
    """A claude run's sandbox, as the daemon writes it into the run's spec."""
    home, grid = tmp_path / "home", tmp_path / "repo" / ".grid"
    made = sandbox_for(
        SandboxSettings(mode="workspace", **settings),
        adapter="claude",
        worktree=grid / "worktrees" / "t1",
        run_dir=grid / "runs" / "claude-1",
        grid_dir=grid,
        home=home,
    )
    assert made is not None
    if made.network == "allowlist":
        return {**made.spec(), "connect_ports": [43127]}
    return made.spec()


def test_the_profile_denies_by_default_and_never_denies_after_an_allow(tmp_path: Path) -> None:
    forms = read(seatbelt.profile(box(tmp_path, network="allowlist")))
    assert forms[0] == ["version", "1"]
    assert forms[1] == ["deny", "default"]
    assert [f for f in forms[2:] if f[0] != "allow"] == []


def test_the_profile_reads_everything_but_the_hidden_paths(tmp_path: Path) -> None:
    spec = box(tmp_path, hidden=["~/.ssh", "~/.aws"])
    forms = read(seatbelt.profile(spec))
    [[readable]] = [r for r in rules(forms, "allow", "file-read*") if r[0][0] == "require-all"]
    assert readable[1] == ["subpath", ("str", "/")]
    shut = [f[1][1][1] for f in readable[2:] if f[0] == "require-not"]
    assert (
        shut
        == spec["hidden"]
        == [
            str(tmp_path / "home" / ".ssh"),
            str(tmp_path / "home" / ".aws"),
            str(tmp_path / "repo" / ".grid"),
        ]
    )


def test_the_profile_writes_only_the_writable_paths_the_run_files_and_devices(
    tmp_path: Path,
) -> None:
    spec = box(tmp_path)
    forms = read(seatbelt.profile(spec))
    writes = rules(forms, "allow", "file-write*")
    assert [strings(w, "subpath") for w in writes] == [spec["writable"]]
    grid = tmp_path / "repo" / ".grid"
    assert spec["writable"] == [
        str(grid / "worktrees" / "t1"),
        str(grid / "runs" / "claude-1" / "tmp"),
        str(tmp_path / "home" / ".claude"),
        str(tmp_path / "home" / ".claude.json"),
    ]
    [appends, devices] = rules(forms, "allow", "file-write-data")
    assert (
        strings(appends, "literal")
        == spec["appendable"]
        == [
            str(grid / "runs" / "claude-1" / "output.log"),
            str(grid / "runs" / "claude-1" / "heartbeat.ndjson"),
        ]
    )
    assert "/dev/null" in strings(devices, "literal")
    assert all(not p.startswith(str(tmp_path)) for p in strings(devices, "literal"))


def test_an_allowlist_reaches_only_its_proxy_port_on_localhost(tmp_path: Path) -> None:
    forms = read(seatbelt.profile(box(tmp_path, network="allowlist")))
    outbound = rules(forms, "allow", "network-outbound")
    assert outbound == [
        [["literal", ("str", seatbelt.RESOLVER)]],
        [["remote", "tcp", ("str", "localhost:43127")]],
    ]
    assert not rules(forms, "allow", "network*") and not rules(forms, "allow", "network-bind")


def test_network_none_reaches_only_the_name_resolver_and_allow_reaches_everything(
    tmp_path: Path,
) -> None:
    none = read(seatbelt.profile(box(tmp_path, network="none")))
    assert rules(none, "allow", "network-outbound") == [[["literal", ("str", seatbelt.RESOLVER)]]]
    assert not rules(none, "allow", "network*")
    allowed = read(seatbelt.profile(box(tmp_path)))
    assert rules(allowed, "allow", "network*") == [[]]


def test_a_path_with_quotes_and_backslashes_stays_one_string(tmp_path: Path) -> None:
    odd = str(tmp_path / 'we"ird\\name) (allow file-write* (subpath "/')
    spec = {"mode": "workspace", "writable": [odd], "hidden": [], "network": "none"}
    forms = read(seatbelt.profile(spec))
    assert [strings(w, "subpath") for w in rules(forms, "allow", "file-write*")] == [[odd]]


def test_the_shim_on_macos_executes_the_agent_through_sandbox_exec(tmp_path: Path) -> None:
    """The shim's Darwin path, on Linux: ``sys.platform`` says darwin and ``sandbox-exec``
    is a stand-in that records its arguments and then runs the agent."""
    recorded = tmp_path / "sandbox-exec.json"
    fake = tmp_path / "sandbox-exec"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(recorded)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "os.execvp(sys.argv[3], sys.argv[3:])\n"
    )
    fake.chmod(0o755)
    run_dir, work = tmp_path / "run", tmp_path / "work"
    run_dir.mkdir()
    work.mkdir()
    sandbox = {"mode": "workspace", "writable": [str(work)], "hidden": [], "network": "none"}
    spec = {
        "argv": [sys.executable, "-c", "open('ran', 'w').write('x')"],
        "cwd": str(work),
        "env": {"PATH": os.environ.get("PATH", "")},
        "stdin": "null",
        "sandbox": sandbox,
    }
    (run_dir / "spec.marshal").write_bytes(marshal.dumps(spec))
    as_macos = (
        "import sys; sys.platform = 'darwin'\n"
        "from gridd.runs import seatbelt, shim\n"
        f"seatbelt.SANDBOX_EXEC = {str(fake)!r}\n"
        f"sys.exit(shim.main({str(run_dir)!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", as_macos], timeout=30, check=False)
    assert done.returncode == 0
    assert json.loads((run_dir / "exit.json").read_text())["exitCode"] == 0
    assert json.loads(recorded.read_text()) == ["-p", seatbelt.profile(sandbox), *spec["argv"]]
    assert (work / "ran").read_text() == "x"
