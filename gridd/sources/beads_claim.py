"""Claiming beads: the claims of agents starting together go to bd as one call.

``bd update <id>... --claim --json`` claims each issue atomically (compare-and-set) and goes
on past one it cannot claim: the issues it claimed are printed as a JSON array, each one it
could not claim gets an ``Error claiming <id>: ...`` (or ``Error resolving <id>: ...``) line
on stderr, and it exits 1 only when it claimed none. One bd start instead of one per agent:
bd serialises its writers, so four claims in a row cost four bd starts on the path to
``agent.spawned``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from gridd.background import Background
from gridd.sources.bd import BdError, BdResult

#: How long the first claim waits for the others of the same scheduler pass.
GATHER_SECONDS = 0.005


def claim_outcomes(ids: list[str], res: BdResult) -> dict[str, str | None]:
    """Per bead: None when bd claimed it, else why not. BdError when bd's answer says
    nothing about the beads (it failed before trying them)."""
    claimed: set[str] = set()
    text = res.out.strip()
    if text.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = []
        claimed = {i["id"] for i in data if isinstance(i, dict) and isinstance(i.get("id"), str)}
    reasons: dict[str, str] = {}
    for line in res.err.splitlines():
        for prefix in ("Error claiming ", "Error resolving "):
            if line.startswith(prefix):
                bead_id, _, why = line[len(prefix) :].partition(": ")
                reasons[bead_id] = why or line
    if res.code != 0 and not claimed and not reasons:
        raise BdError(f"bd update --claim exited {res.code}: {res.message[:300]}")
    if res.code == 0 and not text.startswith("["):
        claimed = set(ids) - set(reasons)  # an older bd without --json output for update
    return {
        bead_id: None if bead_id in claimed else reasons.get(bead_id, "not claimed by bd")
        for bead_id in ids
    }


class ClaimBatcher:
    """Collects the claims made within GATHER_SECONDS and sends them to bd together."""

    def __init__(
        self, run: Callable[[list[str]], Awaitable[BdResult]], background: Background
    ) -> None:
        self._run = run
        self.background = background
        self._waiting: dict[str, asyncio.Future[str | None]] = {}
        self._flush: asyncio.Task[None] | None = None

    async def claim(self, bead_id: str) -> str | None:
        """None when claimed, else bd's reason; BdError when bd could not answer."""
        loop = asyncio.get_running_loop()
        future = self._waiting.get(bead_id)
        if future is None:
            future = self._waiting[bead_id] = loop.create_future()
        if self._flush is None or self._flush.done():
            self._flush = self.background.spawn("beads-claim", self._send())
        return await asyncio.shield(future)

    async def _send(self) -> None:
        await asyncio.sleep(GATHER_SECONDS)
        batch, self._waiting = self._waiting, {}
        ids = list(batch)
        try:
            outcomes = claim_outcomes(ids, await self._run(["update", *ids, "--claim", "--json"]))
        except BdError as exc:
            for future in batch.values():
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException as exc:  # cancelled at shutdown: nobody is left waiting
            for future in batch.values():
                if not future.done():
                    future.set_exception(BdError(f"claim interrupted: {exc!r}"))
            raise
        for bead_id, future in batch.items():
            if not future.done():
                future.set_result(outcomes[bead_id])
