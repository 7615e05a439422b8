"""A sandboxed run's private repository: its own commits, branches, config and hooks, and
none of the repository's.

An agent in a ``workspace`` sandbox (``runs/sandbox.py``) writes its worktree and nothing of
the repository's ``.git``, so in its linked worktree it could not commit. ``make`` gives the
run a repository of its own in the worktree's ``.git``, in place of the file that names
the worktree's git directory: what ``git clone --shared`` makes (``objects/info/alternates``
names the repository's object store, which Landlock keeps read-only), holding the task's
branch at its tip, a copy of the worktree's index and of any merge in progress, the
repository's ignore rules, its identity (``user.name``, ``user.email``) and an ``origin``
naming the repository. The agent's git finds it from its working directory: it commits,
branches, rebases, writes config and hooks there, and none of it reaches the repository,
another task's worktree, or gridd's git (which never follows a worktree's ``.git``:
``worktrees.pinned_git_dir``). Built in-process, not by ``git clone`` (a clone costs as
much as a whole spawn, docs/performance.md), from a spare made ahead (``prepare``).

``reclaim`` brings the run's work back, once it has ended (the finish, a start, recovery):

1. the task's branch is fetched into the repository, by gridd's git in the worktree with
   options the run cannot change (no hooks, ``fetch.fsckObjects``), from a repository gridd
   assembles in ``.grid/`` (``VIEW``): the run's own objects (hard links; pack indexes made
   again), the one ref, gridd's config, the repository's objects as its only alternate.
   Nothing the run wrote but its objects is read: not its config or hooks, not its
   ``objects/info`` (alternates it rewrote could name a store it may not read, for gridd
   to copy);
2. the worktree's branch and index move to that commit (``git reset``, the working files
   as the agent left them); a merge in progress in both stays, with the files the agent
   resolved there marked resolved here;
3. the run's repository goes, and the worktree's own ``.git`` file is put back.

Each step may be done again: a daemon killed anywhere in between repeats them. What the run
left uncommitted is then committed by the finish as for any run (``worktrees.record``);
whatever became of its repository (broken, deleted), the files it left are recorded.

A marker in the worktree's git directory, where no agent writes, says that the worktree's
``.git`` is a run's repository (``MARKER``: which run, and the ``.git`` file to restore).
A ``.git`` the run replaced with a file or a link is left alone: nothing is fetched through
it, and the finish refuses the worktree (``integrity.own_worktree``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gridd.git.runfiles import link_objects, merge_head, object_id, read_small, ref_of
from gridd.git.worktrees import GitError, GitResult, Worktrees, git, pinned_git_dir

log = logging.getLogger(__name__)

#: In the worktree's git directory (``.git/worktrees/<name>/``): the worktree's ``.git`` is
#: a run's private repository.
MARKER = "gridd-private-repo"
#: What a merge in progress is, besides the index: copied into the run's repository.
MERGE_STATE = ("MERGE_HEAD", "MERGE_MSG", "MERGE_MODE")
#: The repository's own rules for what is not tracked, copied so that the agent's
#: ``git add -A`` leaves out what gridd's would.
INFO_FILES = ("exclude", "attributes")
#: Fetching the run's branch back: no hook of the repository's, every object checked.
SAFE_FETCH = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "protocol.file.allow=always",
    "-c",
    "fetch.fsckObjects=true",
)
#: Run in the repository ``reclaim`` assembles: exactly that directory (``--strict``: no
#: ``.git`` file followed), no hooks, no file-system monitor.
UPLOAD_PACK = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false upload-pack --strict"
FETCH_TIMEOUT_SECONDS = 300.0
#: The spare run's repository, in ``.grid/`` (``PrivateRepos.prepare``).
SPARE = "private-spare"
#: Where ``reclaim`` assembles the repository it fetches from, in ``.grid/``.
VIEW = "private-fetch"
PACKED_REFS_HEADER = "# pack-refs with: peeled fully-peeled sorted \n"


@dataclass(frozen=True)
class Reclaimed:
    """What ``reclaim`` brought back: the branch's commit (None when none came back) and,
    when the run's history could not be brought back, why (its files are recorded all the
    same)."""

    tip: str | None
    problem: str = ""


def admin_dir(path: Path) -> Path | None:
    """The worktree's git directory in the repository (``.git/worktrees/<name>``), found
    from the repository's side; None for anything but a task's worktree."""
    pinned = pinned_git_dir(path)
    return Path(pinned["GIT_DIR"]) if pinned else None


def _common_dir(admin: Path) -> Path:
    return (admin / (admin / "commondir").read_text().strip()).resolve()


def _quote(value: str) -> str:
    """A git config value, quoted (a path may hold ``"``, ``\\`` or ``#``)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _skeleton(repo: Path, *, config: str, common: Path) -> None:
    """What every run's repository has alike: its directories (no more than git needs),
    its config, and the repository's object store as its alternate."""
    for sub in ("objects/info", "refs", "info"):
        os.makedirs(repo / sub)
    (repo / "config").write_text(config)
    (repo / "objects" / "info" / "alternates").write_text(f"{common / 'objects'}\n")


class PrivateRepos:
    """Makes and reclaims sandboxed runs' repositories in the worktrees of ``worktrees``."""

    def __init__(
        self, worktrees: Worktrees, *, fetch_timeout: float = FETCH_TIMEOUT_SECONDS
    ) -> None:
        self.worktrees = worktrees
        self.fetch_timeout = fetch_timeout
        #: A run's repository as every run's begins (directories, config, alternates), made
        #: ahead of need (``prepare``), as a spare shim is: taken by one ``make``.
        self.spare = worktrees.dir.parent / SPARE
        self._spare_ready = False
        self._preparing = False
        #: ``git init``'s config for this repository's object format, with the repository's
        #: identity: asked of git once.
        self._config: str | None = None
        self._common: Path | None = None

    def holds(self, path: Path) -> bool:
        """The worktree's ``.git`` is (or was, until reclaimed) a run's repository."""
        admin = admin_dir(path)
        return admin is not None and (admin / MARKER).exists()

    async def make(self, path: Path, *, agent_id: str) -> None:
        """Give the run ``agent_id`` a repository of its own in the worktree at ``path``
        (a repository an earlier run left there is reclaimed first)."""
        admin = admin_dir(path)
        if admin is None:
            raise GitError(
                f"{path} is not a worktree of the repository: no repository of its own for it",
                details={"path": str(path)},
            )
        if (admin / MARKER).exists():
            await self.reclaim(path)
        config = await self._config_text()
        common = self._common = _common_dir(admin)
        head = (admin / "HEAD").read_text().strip()
        ref = head[len("ref: ") :] if head.startswith("ref: ") else ""
        tip = await self._tip(path, common, ref) if ref else object_id(head)
        gitfile = read_small(path / ".git")
        # Written in place, not renamed into it: one file system operation fewer on the
        # spawn's path; a torn marker still says a run's repository is there (``reclaim``).
        (admin / MARKER).write_text(json.dumps({"agent": agent_id, "gitfile": gitfile}))
        repo = path / ".git"
        os.unlink(repo)
        if not self._take_spare(repo):
            _skeleton(repo, config=config, common=common)
        if ref:  # packed: no directories to make for it
            (repo / "packed-refs").write_text(f"{PACKED_REFS_HEADER}{tip} {ref}\n")
            (repo / "HEAD").write_text(f"ref: {ref}\n")
        else:
            (repo / "HEAD").write_text(f"{tip}\n")
        copies = [(admin / n, repo / n) for n in ("index", *MERGE_STATE)]
        copies += [(p, repo / p.name) for p in admin.glob("sharedindex.*")]
        copies += [(common / "info" / n, repo / "info" / n) for n in INFO_FILES]
        for source, target in copies:
            try:
                shutil.copyfile(source, target)
            except FileNotFoundError:
                continue

    def _take_spare(self, repo: Path) -> bool:
        if not self._spare_ready:
            return False
        self._spare_ready = False
        try:
            os.rename(self.spare, repo)
        except OSError:
            return False
        return True

    async def prepare(self) -> None:
        """Make the spare for the next ``make``, off a spawn's path (once one ``make`` has
        learnt the repository: its config and object store)."""
        config, common = self._config, self._common
        if self._spare_ready or self._preparing or config is None or common is None:
            return
        spare = self.spare

        def build() -> None:
            made = spare.with_name(f"{spare.name}.new")
            shutil.rmtree(made, ignore_errors=True)
            _skeleton(made, config=config, common=common)
            shutil.rmtree(spare, ignore_errors=True)  # an earlier daemon's, or a torn one
            os.rename(made, spare)

        self._preparing = True
        try:
            await asyncio.to_thread(build)
        except OSError as exc:  # the next run's repository is made in its place instead
            log.warning("could not make a spare run's repository in %s: %s", spare, exc)
            return
        finally:
            self._preparing = False
        self._spare_ready = True

    async def reclaim(self, path: Path) -> Reclaimed | None:
        """Bring a run's work back from its repository in the worktree at ``path``, and put
        the worktree's ``.git`` file back (see the module's docstring). None when the
        worktree holds no run's repository."""
        admin = admin_dir(path)
        if admin is None:
            return None
        marker = admin / MARKER
        try:
            made = json.loads(marker.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            made = {}
        repo = path / ".git"
        try:
            kind = os.lstat(repo).st_mode
        except FileNotFoundError:
            kind = None
        if kind is not None and not stat.S_ISDIR(kind):
            marker.unlink(missing_ok=True)
            return Reclaimed(None, "its .git is no longer the run's repository: nothing fetched")
        result = Reclaimed(None)
        if kind is not None:
            head = (admin / "HEAD").read_text().strip()
            ref = head[len("ref: ") :] if head.startswith("ref: ") else ""
            old = await self._tip(path, _common_dir(admin), ref) if ref else object_id(head)
            result = await self._fetch(path, admin, repo, ref=ref, old=old)
            await self._take_over(path, admin, repo, old=old, tip=result.tip)
            shutil.rmtree(repo, ignore_errors=True)
            if os.path.lexists(repo):
                raise GitError(
                    f"the run's repository {repo} could not be removed",
                    details={"path": str(repo)},
                )
        gitfile = made.get("gitfile") if isinstance(made, dict) else None
        if not isinstance(gitfile, str) or not gitfile.startswith("gitdir: "):
            gitfile = f"gitdir: {admin}\n"
        tmp = admin / f".{MARKER}.gitfile"
        tmp.write_text(gitfile)
        os.replace(tmp, repo)  # both under the repository's root: one file system
        marker.unlink()
        return result

    async def _fetch(self, path: Path, admin: Path, repo: Path, *, ref: str, old: str) -> Reclaimed:
        """Step 1: the run's branch into the repository's objects (``FETCH_HEAD``), from a
        repository gridd assembles itself in ``.grid/`` (where no agent reaches): the run's
        own objects, the one ref, gridd's config, and the repository's objects as its only
        alternate. Nothing of the run's config, hooks or ``objects/info`` is read (its
        alternates could name an object store it may not read, for gridd to copy)."""
        if not ref:
            return Reclaimed(None, "the worktree is on no branch: nothing fetched")
        tip = ref_of(repo, ref)
        if tip == old:
            return Reclaimed(old)  # no commit of its own on the branch
        if not tip:
            return Reclaimed(None, f"its repository has no branch {ref}: nothing fetched")
        view = self.worktrees.dir.parent / f"{VIEW}-{admin.name}"
        try:
            await asyncio.to_thread(shutil.rmtree, view, True)
            common = _common_dir(admin)
            _skeleton(view, config=await self._config_text(), common=common)
            (view / "packed-refs").write_text(f"{PACKED_REFS_HEADER}{tip} {ref}\n")
            (view / "HEAD").write_text(f"ref: {ref}\n")
            packs = await asyncio.to_thread(link_objects, repo, view)
            for pack in packs:
                indexed = await git(  # (index-pack takes no "--"; the path is absolute)
                    view, "index-pack", str(pack), check=False, timeout=self.fetch_timeout
                )
                if indexed.code != 0:
                    pack.unlink()  # not a pack git can read: its objects are not there
            res = await git(
                path,
                *SAFE_FETCH,
                "fetch",
                "--quiet",
                "--no-tags",
                "--no-recurse-submodules",
                f"--upload-pack={UPLOAD_PACK}",
                str(view),
                ref,
                check=False,
                timeout=self.fetch_timeout,
            )
        except (OSError, GitError) as exc:  # a git that timed out, a file system refusal
            return Reclaimed(None, f"its branch {ref} could not be fetched: {exc}")
        finally:
            await asyncio.to_thread(shutil.rmtree, view, True)
        if res.code != 0:
            problem = res.err.strip()[:500] or f"git fetch exited {res.code}"
            return Reclaimed(None, f"its branch {ref} could not be fetched: {problem}")
        try:
            fetched = object_id((admin / "FETCH_HEAD").read_text())
        except OSError as exc:
            return Reclaimed(None, f"its branch {ref} was fetched, but FETCH_HEAD: {exc}")
        commit = await git(
            path, "rev-parse", "--verify", "--quiet", f"{fetched}^{{commit}}", check=False
        )
        if not fetched or commit.code != 0 or commit.out.strip() != fetched:
            return Reclaimed(None, f"its branch {ref} names no commit ({fetched or 'nothing'})")
        return Reclaimed(fetched)

    async def _take_over(
        self, path: Path, admin: Path, repo: Path, *, old: str, tip: str | None
    ) -> None:
        """Step 2: the worktree's branch and index follow the run's repository."""
        ours, theirs = merge_head(admin), merge_head(repo)
        if tip and tip != old:
            await git(path, "reset", "-q", tip)  # a merge in progress ends with it
        elif ours and theirs != ours:
            await git(path, "reset", "-q", "HEAD")  # the run gave the merge up
        elif ours:
            unmerged = _paths(await git(path, "ls-files", "-u", "-z"))
            resolved = sorted(unmerged - await self._unmerged_in(path, repo, unmerged))
            if resolved:
                await git(path, "--literal-pathspecs", "add", "--", *resolved)

    async def _unmerged_in(
        self, path: Path, repo: Path, otherwise: frozenset[str]
    ) -> frozenset[str]:
        """The paths still unmerged in the run's own index (``otherwise`` when it cannot
        be read): git parses it, read-only, under gridd's git directory and config."""
        index = repo / "index"
        try:
            if not stat.S_ISREG(os.lstat(index).st_mode):
                return otherwise
            res = await git(
                path,
                "ls-files",
                "-u",
                "-z",
                check=False,
                timeout=self.fetch_timeout,
                env={"GIT_INDEX_FILE": str(index)},
            )
        except (OSError, GitError):
            return otherwise
        return _paths(res) if res.code == 0 else otherwise

    async def _tip(self, path: Path, common: Path, ref: str) -> str:
        """The branch's commit in the repository: its loose ref if there is one, else
        git's answer."""
        try:
            tip = object_id((common / ref).read_text())
        except OSError:
            tip = ""
        if tip:
            return tip
        return (await git(path, "rev-parse", "--verify", "HEAD")).out.strip()

    async def _config_text(self) -> str:
        """``git init``'s config for this repository's object format (and this file
        system), an ``origin`` naming the repository, and the repository's identity."""
        if self._config is None:
            root = self.worktrees.root
            fmt = await git(root, "rev-parse", "--show-object-format", check=False)
            objects = fmt.out.strip() if fmt.code == 0 else "sha1"
            with tempfile.TemporaryDirectory(
                prefix=".private-", dir=self.worktrees.dir.parent
            ) as d:
                # (named only when not the default: a git before 2.29 knows no such option)
                spelled = () if objects == "sha1" else (f"--object-format={objects}",)
                await git(Path(d), "init", "-q", "--template=", *spelled, d)
                text = (Path(d) / ".git" / "config").read_text()
            text += f'[remote "origin"]\n\turl = {_quote(str(root))}\n'
            text += "\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
            who = await git(
                root, "config", "--local", "--get-regexp", r"^user\.(name|email)$", check=False
            )
            lines = [ln.split(" ", 1) for ln in who.out.splitlines() if " " in ln]
            if lines:
                text += "[user]\n" + "".join(
                    f"\t{k.split('.', 1)[1]} = {_quote(v)}\n" for k, v in lines
                )
            self._config = text
        return self._config


def _paths(res: GitResult) -> frozenset[str]:
    """The paths of ``git ls-files -u -z`` output (``mode sha stage<TAB>path``)."""
    return frozenset(e.split("\t", 1)[1] for e in res.out.split("\0") if "\t" in e)
