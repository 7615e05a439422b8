"""A run's Landlock ruleset: built (``enforce``, in the shim's child just before ``exec``),
or made ahead by the shim server for the next run of the same kind (``Spare``).

Standard library only, like the shim that loads it (``runs/shim.py``, ``python -I -S``:
loaded from the shim's own directory, with ``landlock.py`` beside it). What a run may do
comes from the daemon (``runs/sandbox.py``) in the run's spec.

"Readable except the hidden paths" is granted entry by entry, Landlock being an allow-list:
read on every entry of ``/`` that holds no hidden path, and, for an entry that does, on each
of its own entries, down the hidden paths' ancestor chains (``_Ruleset.readable``). The
ancestors themselves get only ``READ_DIR``: names inside a hidden directory can be listed,
its files cannot be read. Each entry is opened relative to its directory's descriptor,
never through a symbolic link, and its rule added at once: a rule is on an inode, and
access through a link is checked at the link's target.

Those rules cost a system call or two per entry (hundreds when the workspace sits in
``/tmp``), so the shim server makes them ahead for the next run of the same kind
(``Spare``), and that run's child checks them against the directories before it uses them.
"""

from __future__ import annotations

import errno
import os
import stat
import time

if __package__:
    from gridd.runs import landlock
else:  # loaded by the shim from its own directory (python -I -S): landlock.py is beside it
    import landlock  # type: ignore[no-redef]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


#: How a directory on a hidden path's ancestor chain is opened (to be listed, and walked
#: from) and how any other entry is opened for its rule: relative to its parent's file
#: descriptor and never through a symbolic link, so each rule lands on the inode that was
#: listed under that name, not on what a link planted since points at.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ENTRY_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class _Ruleset:
    """A Landlock ruleset being filled, then bound to this process (``restrict_self``)."""

    def __init__(self, kernel: landlock.Kernel, *, abi: int, net: int) -> None:
        ctypes = kernel.ctypes
        self.kernel = kernel
        self.handled = landlock.fs_rights(abi)
        attr = kernel.attr_type(landlock.fs_rights(abi), net, landlock.scopes(abi))
        # An older kernel rejects a larger struct: ABI 1-3 know only the first field, 4-5 two.
        size = 8 if abi < 4 else 16 if abi < 6 else 24
        fd = kernel.syscall(
            kernel.create_nr, ctypes.byref(attr), ctypes.c_size_t(size), kernel.no_flags
        )
        if fd < 0:
            raise kernel.failure("landlock_create_ruleset")
        self.fd = int(fd)
        self.fd_arg = ctypes.c_int(self.fd)

    def close(self) -> None:
        os.close(self.fd)

    def add(self, fd: int, rights: int, name: str) -> None:
        """A rule: ``rights`` beneath the inode open as ``fd`` (``name``: for a message)."""
        kernel = self.kernel
        kernel.rule.allowed_access = rights
        kernel.rule.parent_fd = fd
        if kernel.syscall(
            kernel.add_nr, self.fd_arg, kernel.path_beneath, kernel.rule_ref, kernel.no_flags
        ):
            error = kernel.failure(f"landlock_add_rule({name})")
            if error.errno == errno.EINVAL and rights & ~landlock.FILE_RIGHTS:
                # Listed as a directory, a file by the time it was opened: a file's rights.
                return self.add(fd, rights & landlock.FILE_RIGHTS, name)
            raise error

    def grant(self, path: str, rights: int) -> None:
        """``rights`` beneath ``path`` (a file: the rights that mean something on a file);
        nothing for a symbolic link (its target is covered, or not, by its own rule) or a
        path that does not exist."""
        try:
            fd = os.open(path, _ENTRY_FLAGS)
        except OSError:
            return
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                return
            rights &= self.handled if stat.S_ISDIR(mode) else self.handled & landlock.FILE_RIGHTS
            if rights:
                self.add(fd, rights, path)
        finally:
            os.close(fd)

    def readable(
        self,
        hidden: list[str],
        *,
        root: str = "/",
        listing: Listing | None = None,
        known: Listing | None = None,
    ) -> None:
        """Read on everything beneath ``root`` but the ``hidden`` paths: ``root`` whole when
        no hidden path lies below it, else each of its entries, the hidden ones left out and
        their ancestors walked the same way (``READ_DIR`` on an ancestor itself). A hidden
        path that does not exist yet is left out all the same: its parent is walked.

        ``listing``: filled with what each walked directory held (a spare's, ``Spare``).
        ``known``: a spare's listing, whose rules this ruleset already has: only entries
        new since are added, and ``_Stale`` is raised if anything it names has left its
        name (a rule would then grant an inode that may now sit below a hidden path)."""
        if any(_inside(root, h) for h in hidden):
            return  # all of it hidden
        if not any(_inside(h, root) for h in hidden):
            if known is None:
                self.grant(root, landlock.READ)
            return
        try:
            fd = os.open(root, _DIR_FLAGS)
        except OSError:
            if known is not None:
                raise _Stale(root) from None
            return  # gone, or a link: nothing beneath it is granted
        visited: list[str] = []
        try:
            self._walk(fd, root, hidden, listing, known, visited)
        finally:
            os.close(fd)
        if known is not None and len(visited) != len(known):
            raise _Stale(root)  # a directory it walked is gone: its rules name inodes elsewhere

    def _walk(
        self,
        dir_fd: int,
        directory: str,
        hidden: list[str],
        listing: Listing | None,
        known: Listing | None,
        visited: list[str],
    ) -> None:
        visited.append(directory)
        prefix = directory.rstrip("/") + "/"
        below = [h[len(prefix) :] for h in hidden if h.startswith(prefix)]
        # Only the names a hidden path goes through are looked at; every other entry of a
        # directory such as /tmp is granted from its directory entry's type alone.
        hide = {b for b in below if "/" not in b}
        walk = {b.partition("/")[0] for b in below if "/" in b} - hide
        had: dict[str, tuple[int, int]] = {}
        dev = -1
        if listing is not None or known is not None:
            started = time.time_ns()
            st = os.fstat(dir_fd)
            dev = st.st_dev
            if known is not None:
                was = known.get(directory)
                if was is None or was[:2] != (st.st_dev, st.st_ino):
                    raise _Stale(directory)
                if was[3] == st.st_ctime_ns:  # no entry added, removed or renamed since
                    for name in walk:
                        self._below(dir_fd, prefix + name, hidden, listing, known, visited)
                    return
                had = was[2]
        seen: dict[str, tuple[int, int]] = {}
        if listing is not None:
            # The directory's change time, kept only if it is older than the listing by
            # more than the kernel's timestamp granularity: then any entry added, removed
            # or renamed later stamps a later one, and a check that finds the same time
            # knows the listing still holds without listing again.
            ctime = st.st_ctime_ns if st.st_ctime_ns < started - UNCHANGED_MARGIN_NS else -1
            listing[directory] = (dev, st.st_ino, seen, ctime)
        if known is None:
            self.add(dir_fd, landlock.READ_DIR & self.handled, directory)
        read = landlock.READ & self.handled
        read_file = landlock.READ & landlock.FILE_RIGHTS & self.handled
        kernel = self.kernel
        rule = kernel.rule
        syscall = kernel.syscall
        args = (kernel.add_nr, self.fd_arg, kernel.path_beneath, kernel.rule_ref, kernel.no_flags)
        matched = 0
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                name = entry.name
                if name in hide:
                    continue
                if name in walk:  # an ancestor of a hidden path: its other entries readable
                    self._below(dir_fd, prefix + name, hidden, listing, known, visited)
                    continue
                old = had.get(name)
                if old is not None:  # a spare's rule names it: still the same inode?
                    try:
                        if old[0] != dev or entry.inode() != old[1]:
                            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                            if (st.st_dev, st.st_ino) != old:
                                raise _Stale(prefix + name)
                    except OSError:
                        raise _Stale(prefix + name) from None
                    matched += 1
                    continue
                try:  # the directory entry's type: no stat on most file systems
                    if entry.is_symlink():
                        continue  # its target is covered (or not) by its own rule
                    rights = read if entry.is_dir(follow_symlinks=False) else read_file
                    fd = os.open(name, _ENTRY_FLAGS, dir_fd=dir_fd)
                except OSError:
                    continue  # gone since it was listed: nothing to grant
                try:
                    rule.allowed_access = rights
                    rule.parent_fd = fd
                    if syscall(*args):
                        self.add(fd, rights, prefix + name)  # the error, or a file's rights
                    if listing is not None:
                        st = os.fstat(fd)
                        seen[name] = (st.st_dev, st.st_ino)
                finally:
                    os.close(fd)
        if matched != len(had):
            raise _Stale(directory)  # an entry a rule names has gone (or moved away)

    def _below(
        self,
        dir_fd: int,
        path: str,
        hidden: list[str],
        listing: Listing | None,
        known: Listing | None,
        visited: list[str],
    ) -> None:
        """Walk the directory ``path``, an entry of the one open as ``dir_fd``."""
        try:
            fd = os.open(path.rpartition("/")[2], _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            if known is not None and path in known:
                raise _Stale(path) from None
            return  # gone, or a link by now: nothing beneath it is granted
        try:
            self._walk(fd, path, hidden, listing, known, visited)
        finally:
            os.close(fd)

    def allow_port(self, port: int) -> None:
        kernel = self.kernel
        net = kernel.port_type(landlock.NET_CONNECT_TCP, port)
        if kernel.syscall(
            kernel.add_nr, self.fd_arg, kernel.net_port, kernel.ctypes.byref(net), kernel.no_flags
        ):
            raise kernel.failure(f"landlock_add_rule(TCP port {port})")

    def restrict_self(self) -> None:
        kernel = self.kernel
        if kernel.syscall(kernel.restrict_nr, self.fd_arg, kernel.no_flags):
            raise kernel.failure("landlock_restrict_self")


#: What a directory on a hidden path's ancestor chain held when a spare ruleset was made:
#: its path -> (device, inode, {entry name: (device, inode) of the inode its rule names},
#: its change time if that can vouch for the entries, else -1).
Listing = dict[str, tuple[int, int, dict[str, tuple[int, int]], int]]
#: More than a tick of the coarse clock the kernel stamps a directory's change time with
#: (4-10 ms at HZ 250-100): a directory changed within this long before a spare listed it
#: is listed again at the check, whatever its change time says.
UNCHANGED_MARGIN_NS = 100_000_000
#: How long a spare ruleset may wait for its run: the inodes its rules name stay referenced
#: meanwhile (a deleted file's space is freed once no ruleset names it), and the older it
#: is, the likelier its check finds a directory changed and the run builds its own.
SPARE_SECONDS = 30.0
#: The shim server makes a spare once its control socket has been quiet this long: not on
#: the CPU the run it just handed off is starting on.
SPARE_QUIET_SECONDS = 0.05


class _Stale(Exception):
    """A spare ruleset's directories changed since it was made (the path that did)."""


def _abi_for(sandbox: dict[str, object]) -> int:
    abi = landlock.abi_version()
    ceiling = sandbox.get("abi")
    if isinstance(ceiling, int):  # the daemon's seam: a kernel that offers less
        abi = min(abi, ceiling)
    return abi


def spare_key(sandbox: dict[str, object]) -> tuple[int, int, tuple[str, ...]] | None:
    """What a spare ruleset must have been made for to serve a run with this ``sandbox``
    (the ABI, the handled network rights, the hidden paths); None: no ruleset for it."""
    mode = str(sandbox.get("mode", "off"))
    network = str(sandbox.get("network", "allow"))
    abi = _abi_for(sandbox)
    if mode == "off" or landlock.unavailable(mode, abi, network) is not None:
        return None
    hidden = tuple(str(p) for p in sandbox.get("hidden", ()))  # type: ignore[attr-defined]
    return (abi, landlock.net_rights(network, abi), hidden)


class Spare:
    """A ruleset made ahead of a run (by the shim server, off the spawn's path) with the
    rules every run of the same ``key`` shares: read on everything but the hidden paths,
    one rule per entry of each directory on their ancestor chains. The run's child checks
    it against those directories as they are then (``_Ruleset.readable`` with ``known``):
    every inode a rule names must still be the one under its name, in the same directory
    (by device and inode), and an entry new since gets its rule there, as when the ruleset
    is built from nothing. Anything changed the other way (an entry gone, replaced, moved
    away: its inode may now sit below a hidden path) and the spare is dropped and the run's
    own ruleset built from nothing. So the ruleset a run gets is the one it would have
    built itself, for the cost of listing those directories. Used by one run only: the
    run's own rules go into it."""

    def __init__(self, key: tuple[int, int, tuple[str, ...]]) -> None:
        abi, net, hidden = key
        self.key = key
        self.made = time.monotonic()
        self.listing: Listing = {}
        self.ruleset = _Ruleset(landlock.kernel(), abi=abi, net=net)
        try:
            self.ruleset.readable(list(hidden), listing=self.listing)
        except BaseException:
            self.ruleset.close()
            raise

    def fresh(self) -> bool:
        return time.monotonic() - self.made < SPARE_SECONDS

    def close(self) -> None:
        self.ruleset.close()


#: The shim server's spares, one per key lately asked for, and the keys owed a new one.
_spares: dict[tuple[int, int, tuple[str, ...]], Spare] = {}
_owed: set[tuple[int, int, tuple[str, ...]]] = set()


def spare_taken(sandbox: dict[str, object]) -> None:
    """In the shim server, once it forked the shim of a run with this ``sandbox``: that
    shim has the matching spare (its copy here is closed), and one is owed for the next."""
    key = spare_key(sandbox)
    if key is None:
        return
    spare = _spares.pop(key, None)
    if spare is not None:
        spare.close()
    _owed.add(key)


def spares_due() -> float | None:
    """Seconds until the shim server should call ``tend_spares`` (None: no need)."""
    if _owed:
        return SPARE_QUIET_SECONDS
    if _spares:
        oldest = min(s.made for s in _spares.values())
        return max(0.001, oldest + SPARE_SECONDS - time.monotonic())
    return None


def tend_spares() -> None:
    """Drop the spares too old to serve, make the ones owed (the shim server, when quiet)."""
    for key, spare in list(_spares.items()):
        if not spare.fresh():
            del _spares[key]
            spare.close()
    while _owed:
        key = _owed.pop()
        try:
            _spares[key] = Spare(key)
        except OSError:
            pass  # the run then builds its own ruleset, as without spares


def take_spare(sandbox: dict[str, object]) -> Spare | None:
    """In a run's shim, forked from the server: the spare made for this ``sandbox``, if
    any; the others are closed (they are the server's to hand to other runs)."""
    key = spare_key(sandbox)
    spare = _spares.pop(key, None) if key is not None else None
    for other in _spares.values():
        other.close()
    _spares.clear()
    _owed.clear()
    return spare


def _checked(spare: Spare | None, sandbox: dict[str, object], hidden: list[str]) -> _Ruleset | None:
    """The ``spare``'s ruleset, if it was made for this ``sandbox`` and is still what the
    directories it lists hold (``Spare``); else None, and the spare is closed."""
    if spare is None:
        return None
    if spare.key == spare_key(sandbox) and spare.fresh():
        try:
            spare.ruleset.readable(hidden, known=spare.listing)
            return spare.ruleset
        except _Stale:
            pass
    spare.close()
    return None


def connect_ports(sandbox: dict[str, object]) -> list[int]:
    """The TCP ports a run may connect to (its proxy's, ``allowlist`` only): the one list
    Landlock's rules are made from and the shim's listener lets through
    (``runs/refusals.py``)."""
    if str(sandbox.get("network", "allow")) != "allowlist":
        return []
    return [int(p) for p in sandbox.get("connect_ports", ())]  # type: ignore[attr-defined]


def enforce(sandbox: dict[str, object], spare: Spare | None = None) -> None:
    """Apply a run's sandbox (the spec's ``sandbox``: ``mode``, ``writable``, ``hidden``,
    ``appendable``, resolved absolute paths; ``network`` and its proxy's ``connect_ports``)
    to this process: the shim's child, just before ``exec``. ``no_new_privs`` first, then
    one ruleset: read on everything but the hidden paths (``_Ruleset.readable``, or a
    ``spare`` made for the same key and checked), every right beneath the writable paths,
    read and write but no truncation of the ``appendable`` files (the run's output log and
    heartbeat file, reached again through ``/dev/stdout``; each is created first: a rule
    needs an inode to name), the usual devices; with a ``network`` other than ``allow``, no
    TCP bind and no TCP connect but to ``connect_ports``. Raises ``SandboxUnavailable`` when
    the kernel cannot or will not. Every path is opened without following a symbolic link
    (an ancestor's entries relative to its directory's descriptor) and its rule added at
    once, so a rule names the inode that was listed, never what a link planted since
    points at."""
    mode = str(sandbox.get("mode", "off"))
    network = str(sandbox.get("network", "allow"))
    if mode == "off":
        if spare is not None:
            spare.close()
        return
    abi = _abi_for(sandbox)
    if (why := landlock.unavailable(mode, abi, network)) is not None:
        raise landlock.SandboxUnavailable(errno.ENOSYS, why)
    writable = [str(p) for p in sandbox.get("writable", ())]  # type: ignore[attr-defined]
    hidden = [str(p) for p in sandbox.get("hidden", ())]  # type: ignore[attr-defined]
    appendable = [str(p) for p in sandbox.get("appendable", ())]  # type: ignore[attr-defined]
    kernel = landlock.kernel()
    if kernel.libc.prctl(landlock.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise kernel.failure("prctl(PR_SET_NO_NEW_PRIVS)")
    ruleset = _checked(spare, sandbox, hidden)
    if ruleset is None:
        ruleset = _Ruleset(kernel, abi=abi, net=landlock.net_rights(network, abi))
        try:
            ruleset.readable(hidden)
        except BaseException:
            ruleset.close()
            raise
    try:
        for path in writable:
            ruleset.grant(path, landlock.fs_rights(abi))
        for path in appendable:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(path, flags, 0o600)
            except OSError:
                continue  # its directory is gone (or it is a link): nothing to write there
            try:
                ruleset.add(fd, (landlock.READ_FILE | landlock.WRITE_FILE) & ruleset.handled, path)
            finally:
                os.close(fd)
        for device in landlock.DEVICES:
            ruleset.grant(
                device,
                landlock.READ
                | landlock.WRITE_FILE
                | landlock.TRUNCATE
                | landlock.IOCTL_DEV
                | landlock.MAKE_REG
                | landlock.REMOVE_FILE,
            )
        for port in connect_ports(sandbox):
            ruleset.allow_port(port)
        ruleset.restrict_self()
    finally:
        ruleset.close()
