"""Batching ``bd update``: the same change to several beads sent as one bd call.

``bd update <id>... <flags> --json`` applies the flags to each issue in turn and goes on
past one it cannot change (bd's cmd/bd/update.go): the issues it changed are printed as a
JSON array; each one it could not change gets an ``Error resolving <id>: ...``, ``Error
claiming <id>: ...``, ``Error updating <id>: ...`` or ``Error updating labels for <id>: ...``
line on stderr; it exits 1 only when it changed none. Input bd refuses as a whole (an
unknown status, a flag it lacks) fails the call for every bead in it, as does bd being
down. bd serialises its writers, so n single-bead calls cost n bd starts where one does.

Writes with the same flags made within ``gather`` seconds of each other share a call;
a batch under way does not hold up the next one, which is sent as soon as it is gathered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from gridd.background import Background
from gridd.sources.bd import BdError, BdResult

RunBd = Callable[[list[str]], Awaitable[BdResult]]
#: Per-bead failure lines, longest prefix first ("updating labels for" before "updating").
_PER_BEAD = ("Error updating labels for ", "Error claiming ", "Error resolving ", "Error updating ")


class BdRefused(BdError):
    """bd answered, refusing the whole call (``reason``: what it said); whether trying
    again can help is ``bd.is_permanent(reason)``."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def update_outcomes(
    ids: list[str], res: BdResult, *, verb: str = "updated"
) -> dict[str, str | None]:
    """Per bead: None when bd changed it, else why not. BdRefused when bd's answer says
    nothing about the beads (it failed before trying them)."""
    changed: set[str] = set()
    text = res.out.strip()
    if text.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = []
        changed = {i["id"] for i in data if isinstance(i, dict) and isinstance(i.get("id"), str)}
    reasons: dict[str, str] = {}
    for line in res.err.splitlines():
        prefix = next((p for p in _PER_BEAD if line.startswith(p)), None)
        if prefix is not None:
            bead_id, _, why = line[len(prefix) :].partition(": ")
            reasons.setdefault(bead_id, why or line)
    if res.code != 0 and not changed and not reasons:
        raise BdRefused(f"bd update exited {res.code}: {res.message[:300]}", reason=res.message)
    if res.code == 0 and not text.startswith("["):
        changed = set(ids) - set(reasons)  # an older bd without --json output for update
    return {
        bead_id: None if bead_id in changed else reasons.get(bead_id, f"not {verb} by bd")
        for bead_id in ids
    }


class UpdateBatcher:
    """Collects ``bd update`` writes by their flags and sends each group as one call."""

    def __init__(
        self, run: RunBd, background: Background, *, gather: float, verb: str = "updated"
    ) -> None:
        self._run = run
        self.background = background
        self.gather = gather
        self.verb = verb
        self._waiting: dict[tuple[str, ...], dict[str, asyncio.Future[str | None]]] = {}
        self._flush: asyncio.Task[None] | None = None
        self.calls = 0

    async def update(self, bead_id: str, flags: tuple[str, ...]) -> str | None:
        """None when bd made the change, else bd's reason; BdError when bd could not answer,
        BdRefused when it refused the call as a whole."""
        group = self._waiting.setdefault(flags, {})
        future = group.get(bead_id)
        if future is None:
            future = group[bead_id] = asyncio.get_running_loop().create_future()
        if self._flush is None or self._flush.done():
            self._flush = self.background.spawn("bd-update-batch", self._send())
        return await asyncio.shield(future)

    async def _send(self) -> None:
        # Writes made while a call is under way go in the next call, sent at once after.
        while self._waiting:
            await asyncio.sleep(self.gather)
            batches, self._waiting = self._waiting, {}
            await asyncio.gather(*(self._send_one(f, group) for f, group in batches.items()))

    async def _send_one(
        self, flags: tuple[str, ...], group: dict[str, asyncio.Future[str | None]]
    ) -> None:
        ids = list(group)
        try:
            self.calls += 1
            res = await self._run(["update", *ids, *flags, "--json"])
            outcomes = update_outcomes(ids, res, verb=self.verb)
        except BdError as exc:
            for future in group.values():
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException as exc:  # cancelled at shutdown: nobody is left waiting
            for future in group.values():
                if not future.done():
                    future.set_exception(BdError(f"bd update interrupted: {exc!r}"))
            raise
        for bead_id, future in group.items():
            if not future.done():
                future.set_result(outcomes[bead_id])
