"""The Landlock ruleset a run gets (``runs/landlock_rules.py``), built from nothing or from a
spare the shim server made ahead (``Spare``): the same reads refused and allowed either
way, and a spare that no longer matches its directories is never used, whatever was swapped
in between: an entry made a hidden path, or replaced by a symbolic link to one.

Real rulesets on this kernel, each applied in a forked child (a ruleset cannot be taken
back), which then tries its reads and writes and says what came of each.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gridd.runs import landlock, landlock_rules, shim

pytestmark = pytest.mark.skipif(landlock.abi_version() < 1, reason="this kernel offers no Landlock")


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Path]:
    """A directory with readable entries, a hidden one and a workspace whose ``.grid`` is
    hidden, below directories with other entries (``/tmp``'s)."""
    root = tmp_path / "box"
    for name, text in {
        "pub/file.txt": "public\n",
        "decoy/note.txt": "decoy\n",
        "secret/key": "KEY\n",
        "ws/.grid/db": "DB\n",
        "ws/src.txt": "source\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "work").mkdir()
    yield Path(os.path.realpath(root))
    landlock_rules.take_spare({})  # whatever a test left in the module's spares


def _sandbox(box: Path, *hidden: str) -> dict[str, object]:
    return {
        "mode": "workspace",
        "writable": [str(box / "work")],
        "hidden": [str(box / h) for h in ("secret", "ws/.grid", *hidden)],
        "appendable": [],
    }


def _tries(
    sandbox: dict[str, object],
    reads: list[Path],
    *,
    spare: landlock_rules.Spare | None = None,
    between: Callable[[], None] | None = None,
) -> dict[str, str]:
    """In a forked child: ``enforce`` (with ``spare``), then, after ``between`` ran here,
    read each of ``reads`` and write ``work/w`` and ``pub/w``: ``ok`` or the errno's name."""
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the pipe)
        code = 1
        try:
            os.close(go_w)
            os.close(out_r)
            if spare is None:
                landlock_rules.enforce(sandbox)
            else:
                landlock_rules.enforce(sandbox, spare)
            os.write(out_w, b"enforced\n")
            os.read(go_r, 1)
            seen: dict[str, str] = {}
            writable = Path(str(sandbox["writable"][0]))  # type: ignore[index]
            probes = [(str(p), "r") for p in reads]
            probes += [(str(writable / "w"), "w"), (str(writable.parent / "pub" / "w"), "w")]
            for path, how in probes:
                try:
                    if how == "r":
                        Path(path).read_bytes()
                    else:
                        Path(path).write_text("w\n")
                    seen[path] = "ok"
                except OSError as exc:
                    seen[path] = errno.errorcode.get(exc.errno or 0, str(exc))
            os.write(out_w, json.dumps(seen).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(out_w)
    if spare is not None:
        spare.close()  # the child's now, as in the shim
    with os.fdopen(out_r, "rb") as out:
        assert out.readline() == b"enforced\n"
        if between is not None:
            between()
        os.write(go_w, b"g")
        os.close(go_w)
        report = out.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0, report
    return {
        str(Path(k).relative_to(Path(str(sandbox["writable"][0])).parent)): v  # type: ignore[index]
        for k, v in json.loads(report).items()
    }


READS = ["pub/file.txt", "decoy/note.txt", "secret/key", "ws/.grid/db", "ws/src.txt"]
EXPECTED = {
    "pub/file.txt": "ok",
    "decoy/note.txt": "ok",
    "secret/key": "EACCES",
    "ws/.grid/db": "EACCES",
    "ws/src.txt": "ok",
    "work/w": "ok",
    "pub/w": "EACCES",
}


def test_a_spare_ruleset_allows_and_refuses_what_one_built_at_the_spawn_does(box: Path) -> None:
    sandbox = _sandbox(box)
    reads = [box / r for r in READS]
    built = _tries(sandbox, reads)
    key = landlock_rules.spare_key(sandbox)
    assert key is not None
    spare = landlock_rules.Spare(key)
    (box / "made-since.txt").write_text("new\n")  # after the spare: added by its check
    spared = _tries(sandbox, [*reads, box / "made-since.txt"], spare=spare)
    assert built == EXPECTED
    assert spared == {**EXPECTED, "made-since.txt": "ok"}


def _aged(box: Path) -> None:
    """Let ``box``'s change time fall further behind than ``UNCHANGED_MARGIN_NS``, so that a
    spare made now may vouch for its entries by that time alone (and must notice it move)."""
    margin = landlock_rules.UNCHANGED_MARGIN_NS / 1e9
    while time.time() - box.stat().st_ctime <= margin:
        time.sleep(margin / 4)


def test_a_spare_for_directories_unchanged_since_serves_without_listing_them_again(
    box: Path,
) -> None:
    _aged(box)
    sandbox = _sandbox(box)
    key = landlock_rules.spare_key(sandbox)
    assert key is not None
    spare = landlock_rules.Spare(key)
    assert spare.listing[str(box)][3] == box.stat().st_ctime_ns  # it vouches for the entries
    assert _tries(sandbox, [box / r for r in READS], spare=spare) == EXPECTED


def test_an_entry_renamed_to_a_hidden_path_after_the_spare_was_made_stays_hidden(
    box: Path,
) -> None:
    """The spare's rule names ``decoy``'s inode; renamed to the hidden ``vault`` and given a
    secret, it must not be readable through that rule: the check sees the directory's
    change time move, lists it again and finds ``decoy`` gone."""
    _aged(box)
    sandbox = _sandbox(box, "vault")
    key = landlock_rules.spare_key(sandbox)
    assert key is not None
    spare = landlock_rules.Spare(key)
    assert spare.listing[str(box)][3] != -1
    (box / "decoy").rename(box / "vault")
    (box / "vault" / "key").write_text("KEY\n")
    seen = _tries(sandbox, [box / "vault" / "key", box / "pub" / "file.txt"], spare=spare)
    assert seen["vault/key"] == "EACCES"
    assert seen["pub/file.txt"] == "ok"


def test_an_entry_replaced_by_a_link_to_a_hidden_path_after_the_spare_grants_nothing(
    box: Path,
) -> None:
    sandbox = _sandbox(box)
    key = landlock_rules.spare_key(sandbox)
    assert key is not None
    spare = landlock_rules.Spare(key)
    (box / "pub" / "file.txt").unlink()
    (box / "pub").rmdir()
    (box / "pub").symlink_to(box / "secret")
    seen = _tries(sandbox, [box / "pub" / "key", box / "secret" / "key"], spare=spare)
    assert seen["pub/key"] == "EACCES"
    assert seen["secret/key"] == "EACCES"


def test_a_hidden_path_made_after_the_sandbox_was_applied_is_unreadable(box: Path) -> None:
    """Its parent holds no other hidden path: it is listed all the same, not granted whole,
    so ``~/.aws`` made while an agent runs stays out of its reach."""
    sandbox = {**_sandbox(box), "hidden": [str(box / "later")]}

    def make_it() -> None:
        (box / "later").mkdir()
        (box / "later" / "key").write_text("KEY\n")

    seen = _tries(sandbox, [box / "later" / "key", box / "pub" / "file.txt"], between=make_it)
    assert seen["later/key"] == "EACCES"
    assert seen["pub/file.txt"] == "ok"


def test_the_shim_server_makes_a_spare_for_the_kind_of_run_it_just_handed_off(box: Path) -> None:
    boxed = _sandbox(box)
    fenced = {**boxed, "network": "allowlist"}
    assert landlock_rules.spares_due() is None
    landlock_rules.spare_taken(boxed)  # a run of this sandbox was forked: one is owed
    assert landlock_rules.spares_due() == landlock_rules.SPARE_QUIET_SECONDS
    landlock_rules.tend_spares()
    due = landlock_rules.spares_due()
    assert due is not None and due > landlock_rules.SPARE_SECONDS - 5
    if landlock.abi_version() >= landlock.NET_ABI:  # its own key: it handles TCP rights
        assert landlock_rules.take_spare(fenced) is None
        landlock_rules.spare_taken(boxed)
        landlock_rules.tend_spares()
    spare = landlock_rules.take_spare(boxed)
    assert spare is not None and spare.key == landlock_rules.spare_key(boxed)
    assert landlock_rules.spares_due() is None  # a run's shim keeps none but its own
    assert _tries(boxed, [box / r for r in READS], spare=spare) == EXPECTED


AGENT = """
import errno, json, os
seen = {}
for name in ("secret/key", "pub/file.txt"):
    try:
        open(os.path.join(BOX, name), "rb").close()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = errno.errorcode[exc.errno]
seen["fds"] = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps(seen))
"""


def test_the_shim_hands_the_servers_spare_to_the_agent_and_leaks_no_descriptor(
    box: Path, tmp_path: Path
) -> None:
    """What a shim forked by the server does: it takes the spare made for its run's kind
    (inherited through the fork), keeps its descriptor through the child's closing of all
    others, and the agent runs bound by it, holding nothing but its stdio."""
    sandbox = _sandbox(box)
    landlock_rules.spare_taken(sandbox)  # the server, as it hands a run of this kind off
    landlock_rules.tend_spares()
    assert landlock_rules.spares_due() is not None  # one is ready
    log = tmp_path / "output.log"
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    stdin = os.open(os.devnull, os.O_RDONLY)
    script = f"BOX = {str(box)!r}\n{AGENT}"
    spec: dict[str, object] = {
        "argv": [sys.executable, "-I", "-S", "-c", script],
        "cwd": str(box / "work"),
        "env": {"PATH": os.defpath},
        "sandbox": sandbox,
    }
    try:
        pid = shim._spawn(spec, stdin, out)
    finally:
        os.close(out)
        os.close(stdin)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, log.read_text()
    assert landlock_rules.spares_due() is None  # the run took it
    seen = json.loads(log.read_text())
    assert seen == {"secret/key": "EACCES", "pub/file.txt": "ok", "fds": [0, 1, 2, 3]}
