"""Git without the keys to the house: a sandboxed agent commits, branches and rebases in a
repository of its own (``git/private.py``), gridd brings its branch back, and nothing it
does with git reaches the user's repository, another task's worktree, or gridd's own git.

Real daemon, real shims, real git, on this kernel's Landlock. Each attack of issue 24 is
also run with the sandbox off (the control), where it succeeds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gridd.errors import DaemonUnreachable
from gridd.git.private import MARKER, PrivateRepos
from gridd.git.worktrees import Worktrees
from gridd.runs import landlock
from tests.anthropic_standin import standin, tool
from tests.real_cli import agent_of, claude_profile, needs, start
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon, restartable_daemon
from tests.support.git import git_show
from tests.support.repos import agent_command, write_core_config
from tests.support.sse import event_log
from tests.support.waits import wait_for
from tests.test_merge_queue import runs, start_conflict

pytestmark = pytest.mark.skipif(landlock.abi_version() < 1, reason="this kernel offers no Landlock")

ATTACKS = ("filter_driver", "orphan_main", "remove_worktree", "repoint")
#: The victim: another task whose agent has work it has not committed yet.
VICTIM = ["/bin/sh", "-c", "echo precious > unsaved.txt && exec sleep 600"]


@pytest.fixture
def outside() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="go") as d:
        yield Path(d)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _subjects(repo: Path, rev_range: str) -> list[str]:
    return _git(repo, "log", "--format=%s", rev_range).splitlines()


def _attack(repo: Path, outside: Path, mode: str) -> tuple[dict[str, str], str]:
    """The attacker beside the victim; its task approved and merged. What each attack came
    to (the agent's word), and the marker written by any driver or hook gridd's git ran."""
    marker = outside / "ran-in-the-daemon"
    victim = repo / ".grid" / "worktrees" / "victim"
    write_core_config(
        repo,
        agents={
            "boxed": {
                "command": agent_command("git_attacks.py", str(repo), str(victim), str(marker)),
                "sandbox": {"mode": mode},
            },
            "plain": {"command": VICTIM},
        },
        scheduler={"default_agent": "boxed"},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "victim", "title": "another task", "agent": "plain"})
        c.post("/tasks", {"id": "boxed", "title": "git attacks", "maxAttempts": 1})
        c.post("/session/start", {"featureBranch": "feature/box", "maxAgents": 2})
        wait_task_status(c, "boxed", "review", timeout=90)
        c.post("/tasks/boxed/approve")
        wait_task_status(c, "boxed", "done", timeout=90)
        attacks = json.loads(git_show(repo, "feature/box:attacks.json") or "{}")
    return attacks, marker.read_text() if marker.exists() else ""


def test_a_sandboxed_agent_commits_branches_and_rebases_while_every_git_attack_fails(
    repo: Path, outside: Path
) -> None:
    main_before = _git(repo, "rev-parse", "main")
    attacks, ran = _attack(repo, outside, "workspace")
    assert attacks == dict.fromkeys(ATTACKS, "denied")
    # its own history came back: its commits, rebased as it rebased them, then gridd's
    # commit of what it left, all merged
    assert _subjects(repo, "main..feature/box")[1:] == [
        "gridd: boxed: git attacks",
        "agent: attributes",
        "agent: first",
        "agent: side",
    ]
    assert _git(repo, "rev-parse", "main") == main_before
    assert _git(repo, "status", "--porcelain", "--untracked-files=no") == ""  # the user's index
    assert (repo / ".grid" / "worktrees" / "victim" / "unsaved.txt").read_text() == "precious\n"
    assert ran == "", "a filter driver or hook the agent wrote ran in gridd's git"
    assert "gridattack" not in (repo / ".git" / "config").read_text()
    assert not [p for p in (repo / ".git" / "hooks").iterdir() if not p.name.endswith(".sample")]


def test_without_the_sandbox_every_git_attack_succeeds(repo: Path, outside: Path) -> None:
    """The control: the same agent, mode off, moves main, removes the other task's
    worktree with its uncommitted work, and has its filter and hooks run by gridd."""
    attacks, ran = _attack(repo, outside, "off")
    assert attacks == dict.fromkeys(ATTACKS, "allowed")
    assert _subjects(repo, "main") == ["orphan"]
    assert not (repo / ".grid" / "worktrees" / "victim").exists()
    assert {"filter", "hook"} <= set(ran.split())


def _work(repo: Path, *, wait: bool = False, crash: str | None = None) -> None:
    write_core_config(
        repo,
        agents={
            "boxed": {
                "command": agent_command("git_work.py", *(["wait"] if wait else [])),
                "sandbox": {"mode": "workspace"},
            }
        },
        scheduler={"default_agent": "boxed", "stop_when_idle": False},
    )
    if crash is not None:
        with (repo / ".grid" / "config.toml").open("a") as fh:
            fh.write(f'\n[daemon]\ncrash_points = ["{crash}"]\n')


def _its_work_is_on_its_branch_once(repo: Path) -> None:
    """The agent's two commits, then gridd's commit of the file it left; the worktree a
    plain linked worktree again."""
    assert _subjects(repo, "main..grid/w") == [
        "gridd: w: work",
        "agent: second",
        "agent: first",
    ]
    assert git_show(repo, "grid/w:left.txt") == "left uncommitted\n"
    worktree = repo / ".grid" / "worktrees" / "w"
    assert (worktree / ".git").read_text() == f"gitdir: {repo / '.git' / 'worktrees' / 'w'}\n"
    assert not (repo / ".git" / "worktrees" / "w" / MARKER).exists()


def test_a_sandboxed_runs_commits_survive_a_daemon_killed_mid_run(repo: Path) -> None:
    """kill -9 while the agent runs, between its two commits: the restarted daemon
    reattaches it, and both commits reach the task's branch."""
    _work(repo, wait=True)
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "w", "title": "work", "maxAttempts": 1})
        c.post("/session/start", {"maxAgents": 1})
        (agent,) = wait_for(lambda: [a for a in c.get("/agents") if a["pid"]], timeout=30)
        log = Path(agent["runDir"]) / "output.log"
        wait_for(lambda: "waiting" in log.read_text(), timeout=30, message="the first commit")
        grid.kill9()
        grid.start()
        (after,) = wait_for(lambda: [a for a in c.get("/agents") if a["pid"]], timeout=30)
        assert after["pid"] == agent["pid"]
        (repo / ".grid" / "worktrees" / "w" / "go").touch()
        wait_task_status(c, "w", "review", timeout=60)
    _its_work_is_on_its_branch_once(repo)


@pytest.mark.parametrize("point", ["spawn.private_repo", "finish.reclaimed"])
def test_a_daemon_killed_around_a_runs_own_repository_loses_nothing(repo: Path, point: str) -> None:
    """Killed with the run's repository made and its agent not started (the run is fenced
    and the task runs again in a new one), or with the run's commits just brought back
    and nothing else of its finish done (the finish is done again): either way the work
    is on the branch once, and the worktree is a plain one."""
    _work(repo, crash=point)
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "w", "title": "work", "maxAttempts": 1})
        with contextlib.suppress(DaemonUnreachable, httpx.TransportError):
            c.post("/session/start", {"maxAgents": 1})
        assert grid.daemon is not None
        assert grid.daemon.proc.wait(60) is not None, "the daemon did not die at its crash point"
        _work(repo)
        grid.start()
        task = wait_task_status(c, "w", "review", timeout=60)
        assert task["attempts"] == 1
        assert not [e for e in event_log(c) if e.type in ("agent.failed", "agent.warning")]
    _its_work_is_on_its_branch_once(repo)


async def test_a_conflict_the_agent_resolved_in_its_own_index_is_resolved_in_gridds(
    repo: Path,
) -> None:
    """A run sent back with a merge in progress gets it in its own repository; files it
    resolves and adds there (without committing) are resolved in gridd's index when its
    repository is reclaimed, and the merge stays in progress for the finish to conclude."""
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")
    await worktrees.setup()
    tree = await worktrees.create("t", None)
    for where, text in ((tree.path, "task\n"), (repo, "main\n")):
        (where / "both.txt").write_text(text)
        _git(where, "add", "both.txt")
        _git(where, "commit", "-q", "-m", f"both.txt: {text.strip()}")
    merging = subprocess.run(
        ["git", "-C", str(tree.path), "merge", "-q", "main"], capture_output=True, check=False
    )
    assert merging.returncode != 0, "the merge was meant to conflict"
    private = PrivateRepos(worktrees)
    await private.make(tree.path, agent_id="a-1")
    status = _git(tree.path, "status", "--porcelain")  # as the agent's git finds it
    assert status.startswith("AA both.txt"), status  # the merge, unresolved
    (tree.path / "both.txt").write_text("task and main\n")
    _git(tree.path, "add", "both.txt")
    reclaimed = await private.reclaim(tree.path)
    assert reclaimed is not None and reclaimed.problem == ""
    assert _git(tree.path, "ls-files", "-u") == ""
    assert (repo / ".git" / "worktrees" / "t" / "MERGE_HEAD").exists()
    committed, _ = await worktrees.record(tree.path, "concluded")
    assert committed
    assert len(_git(tree.path, "log", "-1", "--format=%P").split()) == 2  # a merge commit


async def test_the_next_runs_repository_is_made_ahead_and_works_like_one_made_in_place(
    repo: Path,
) -> None:
    """After a run's repository is made, a spare is prepared off the spawn's path and taken
    by the next run (an earlier daemon's spare is never taken: it is replaced); a run in
    it commits, and its commit comes back."""
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")
    await worktrees.setup()
    tree = await worktrees.create("t", None)
    private = PrivateRepos(worktrees)
    private.spare.mkdir(parents=True)
    (private.spare / "left-by-an-earlier-daemon").touch()
    await private.make(tree.path, agent_id="a-1")
    assert not (tree.path / ".git" / "left-by-an-earlier-daemon").exists()
    await private.reclaim(tree.path)
    await private.prepare()
    assert sorted(p.name for p in private.spare.iterdir()) == ["config", "info", "objects", "refs"]
    await private.make(tree.path, agent_id="a-2")
    assert not private.spare.exists()  # taken
    (tree.path / "mine.txt").write_text("mine\n")
    _git(tree.path, "add", "mine.txt")
    _git(tree.path, "commit", "-q", "-m", "agent: mine")
    reclaimed = await private.reclaim(tree.path)
    assert reclaimed is not None and reclaimed.tip == _git(repo, "rev-parse", "grid/t")
    assert _subjects(repo, "main..grid/t") == ["agent: mine"]


@needs("claude")
@pytest.mark.timeout(180)
def test_the_real_claude_cli_commits_with_bash_inside_the_sandbox(
    repo: Path, tmp_path: Path
) -> None:
    """The pinned Claude Code CLI, sandboxed (its network the API's stand-in only), writes
    a file and commits it with Bash's git; the commit, with its message, reaches the
    task's branch."""
    home = tmp_path / "home"
    home.mkdir()
    with standin() as api:
        profile = claude_profile(api.url, home, allowed_tools=["Bash", "Write"])
        profile["sandbox"] = {
            "mode": "workspace",
            "network": "allowlist",
            "allow_hosts": [api.url.removeprefix("http://")],
        }
        write_core_config(repo, agents={"claude": profile}, scheduler={"default_agent": "claude"})
        worktree = repo / ".grid" / "worktrees" / "box"
        commit = "git add hello.txt && git commit -q -m 'claude: hello' && git log -1 --format=%s"
        api.push(
            tool("Write", {"file_path": str(worktree / "hello.txt"), "content": "hello\n"}),
            tool("Bash", {"command": commit, "description": "commit the work"}),
        )
        with core_daemon(repo) as daemon:
            c = daemon.client()
            start(c, "box")
            task = wait_task_status(c, "box", "review", timeout=120)
            agent = agent_of(c, "box")
        _, bash = api.tool_results()
    assert agent["exitCode"] == 0, agent
    assert "claude: hello" in str(bash["content"]), bash
    assert task["changedFiles"] == ["hello.txt"]
    assert _subjects(repo, "main..grid/box") == ["claude: hello"]


async def test_alternates_the_run_rewrote_bring_nothing_it_could_not_read_into_the_repository(
    repo: Path, outside: Path
) -> None:
    """A run may not read another object store (hidden from it), but gridd may: a run that
    names it in its ``objects/info/alternates`` and points its branch at a commit there
    must not have gridd copy that commit into the repository. gridd fetches from a
    repository it assembles itself (the run's own objects, never its ``objects/info``)."""
    secret = outside / "secret"
    secret.mkdir()
    _git(secret, "init", "-q")
    (secret / "secret.txt").write_text("s3cr3t\n")
    _git(secret, "add", "secret.txt")
    _git(secret, "-c", "user.name=s", "-c", "user.email=s@x", "commit", "-q", "-m", "secret")
    sha = _git(secret, "rev-parse", "HEAD")
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")
    await worktrees.setup()
    tree = await worktrees.create("t", None)
    private = PrivateRepos(worktrees)
    await private.make(tree.path, agent_id="a-1")
    own = tree.path / ".git"
    with (own / "objects" / "info" / "alternates").open("a") as alternates:
        alternates.write(f"{secret / '.git' / 'objects'}\n")
    (own / "packed-refs").write_text(f"{sha} refs/heads/grid/t\n")
    reclaimed = await private.reclaim(tree.path)
    assert reclaimed is not None and reclaimed.tip is None
    assert "could not be fetched" in reclaimed.problem
    assert git_show(repo, f"{sha}:secret.txt") is None
    assert _subjects(repo, "main..grid/t") == []


async def test_a_run_whose_objects_were_packed_still_brings_its_commits_back(repo: Path) -> None:
    """Objects the run's git packed (``git gc``) come back: gridd indexes the packs itself."""
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")
    await worktrees.setup()
    tree = await worktrees.create("t", None)
    private = PrivateRepos(worktrees)
    await private.make(tree.path, agent_id="a-1")
    for n in range(3):
        (tree.path / f"f{n}.txt").write_text(f"{n}\n")
        _git(tree.path, "add", f"f{n}.txt")
        _git(tree.path, "commit", "-q", "-m", f"agent: {n}")
    _git(tree.path, "gc", "-q")
    assert list((tree.path / ".git" / "objects" / "pack").glob("pack-*.pack"))
    reclaimed = await private.reclaim(tree.path)
    assert reclaimed is not None and reclaimed.problem == ""
    assert _subjects(repo, "main..grid/t") == ["agent: 2", "agent: 1", "agent: 0"]


def test_a_sandboxed_agent_sent_back_with_a_conflict_resolves_it_in_its_own_repository(
    repo: Path, logdir: Path
) -> None:
    """The merge queue sends a conflicted task back (the feature branch merged into its
    worktree, conflicts left): its sandboxed agent sees the merge in its own repository,
    resolves and stages the files there without committing, and the merge it concluded
    lands with both sides' lines."""
    write_core_config(
        repo,
        agents={
            "edit": {
                "command": agent_command("editor.py", str(logdir), "{prompt}"),
                "sandbox": {"mode": "workspace", "writable": [str(logdir)]},
            }
        },
        scheduler={"default_agent": "edit"},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        start_conflict(c, "agent")
        c.post("/tasks/y/approve")
        wait_for(lambda: runs(logdir, "y")[1:], timeout=60, message="y's second run")
        assert runs(logdir, "y")[1]["resolved"] == ["shared.txt"]
        wait_task_status(c, "y", "review", timeout=60)
        c.post("/tasks/y/approve")
        wait_task_status(c, "y", "done", timeout=60)
    text = git_show(repo, "feature/clash:shared.txt") or ""
    assert "line from x" in text and "line from y" in text and "<<<<<<<" not in text
    parents = _git(repo, "log", "-1", "--format=%P", "grid/y").split()
    assert len(parents) == 2  # the merge of the feature branch, concluded


def _plain(repo: Path, task_id: str) -> bool:
    """The task's worktree is a plain linked worktree: its ``.git`` the file naming its git
    directory, no marker of a run's repository."""
    admin = repo / ".git" / "worktrees" / task_id
    dotgit = repo / ".grid" / "worktrees" / task_id / ".git"
    return dotgit.is_file() and not (admin / MARKER).exists()


def test_a_sandboxed_start_that_fails_leaves_its_worktree_a_plain_one(repo: Path) -> None:
    """The run's repository is made before its process starts; a start refused after that
    (here: no Landlock, the daemon's seam) gives the worktree back as it was."""
    _work(repo)
    with (repo / ".grid" / "config.toml").open("a") as config:
        config.write("\n[daemon]\nlandlock_abi = 0\n")
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "w", "title": "work", "maxAttempts": 1})
        c.post("/session/start", {"maxAgents": 1})
        task = wait_task_status(c, "w", "failed", timeout=30)
    assert "sandbox_unavailable" in str(task["error"])
    assert _plain(repo, "w")


def test_recovery_reclaims_a_runs_repository_no_run_will_use(repo: Path) -> None:
    """Killed with a run's repository made and its agent not started, the daemon restarts
    with the task's profile gone from its configuration: the fenced run's task cannot
    start again (nothing of a start reclaims), and recovery gives its worktree back."""
    _work(repo, crash="spawn.private_repo")
    with restartable_daemon(repo) as grid:
        c = grid.client()
        c.post("/tasks", {"id": "w", "title": "work", "agent": "boxed", "maxAttempts": 1})
        with contextlib.suppress(DaemonUnreachable, httpx.TransportError):
            c.post("/session/start", {"maxAgents": 1})
        assert grid.daemon is not None
        assert grid.daemon.proc.wait(60) is not None, "the daemon did not die at its crash point"
        assert not _plain(repo, "w")
        write_core_config(
            repo,
            agents={"other": {"command": agent_command("git_work.py")}},
            scheduler={"default_agent": "other", "stop_when_idle": False},
        )
        grid.start()
        task = wait_task_status(c, "w", "failed", timeout=30)
        assert "unknown agent profile" in str(task["error"])
        assert _plain(repo, "w")


def test_a_sandboxed_agent_fetches_the_repositorys_branches_from_its_origin(repo: Path) -> None:
    """The run's repository has the task's branch only; its ``origin`` is the repository,
    which the sandbox lets it read: ``git fetch origin`` brings ``origin/main``."""
    probe = "git fetch -q origin && git rev-parse origin/main > fetched.txt"
    write_core_config(
        repo,
        agents={"boxed": {"command": ["/bin/sh", "-c", probe], "sandbox": {"mode": "workspace"}}},
        scheduler={"default_agent": "boxed"},
    )
    with core_daemon(repo) as daemon:
        c = daemon.client()
        c.post("/tasks", {"id": "f", "title": "fetch", "maxAttempts": 1})
        c.post("/session/start", {"maxAgents": 1})
        wait_task_status(c, "f", "review", timeout=60)
    assert git_show(repo, "grid/f:fetched.txt") == _git(repo, "rev-parse", "main") + "\n"


async def test_a_branch_the_run_pointed_at_no_commit_brings_nothing_and_blocks_nothing(
    repo: Path,
) -> None:
    """A run that wrote its branch's ref by hand, naming a blob: nothing is brought back,
    it says why, and the worktree is a plain one again (its files are the finish's to
    record), instead of a reset that fails on every retry."""
    worktrees = Worktrees(repo, repo / ".grid" / "worktrees")
    await worktrees.setup()
    tree = await worktrees.create("t", None)
    private = PrivateRepos(worktrees)
    await private.make(tree.path, agent_id="a-1")
    (tree.path / "blob.txt").write_text("not a commit\n")
    blob = _git(tree.path, "hash-object", "-w", "blob.txt")
    ref = tree.path / ".git" / "refs" / "heads" / "grid" / "t"
    ref.parent.mkdir(parents=True)
    ref.write_text(f"{blob}\n")
    before = _git(repo, "rev-parse", "grid/t")
    reclaimed = await private.reclaim(tree.path)
    assert reclaimed is not None and reclaimed.tip is None
    assert "names no commit" in reclaimed.problem
    assert _git(repo, "rev-parse", "grid/t") == before
    assert _plain(repo, "t")
