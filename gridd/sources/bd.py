"""Running ``bd``: one subprocess per call, its result, and whether a failure is worth retrying.

bd exits 1 for every error (cobra and ``FatalErrorRespectJSON`` alike), so what kind of
failure it was is read from its message. Bad input (an unknown status, flag or issue, a
guard such as a blocked close) fails the same way every time: permanent. Anything else (the
database down, a lock, a timeout) may pass: transient, retried with backoff.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_SECONDS = 30.0

#: Phrases of bd's messages for input it will refuse again, from bd's source (cmd/bd/*.go,
#: internal/validation, internal/storage/issueops/claim.go) and cobra's flag parser.
_PERMANENT = (
    "invalid status",
    "unknown flag",
    "unknown shorthand flag",
    "unknown command",
    "flag needs an argument",
    "invalid argument",
    "no issue found matching",
    "not found",
    "cannot close",
    "cannot modify",
    "already claimed",
    "not claimable",
    "already closed",
    "cannot be empty",
    "comment text required",
    "read-only mode",
)


class BdError(Exception):
    """bd could not be run, timed out, or printed something unusable."""


@dataclass(frozen=True)
class BdResult:
    code: int
    out: str
    err: str

    @property
    def message(self) -> str:
        """What bd said went wrong: the JSON error on stdout (``--json``), else stderr."""
        text = self.out.strip()
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                data = None
            if isinstance(data, dict):
                inner = data.get("data") if isinstance(data.get("data"), dict) else data
                if isinstance(inner, dict) and isinstance(inner.get("error"), str):
                    return str(inner["error"])[:500]
        return (self.err.strip() or text)[:500]


def is_permanent(message: str) -> bool:
    """True when bd refused the input itself: retrying the same call cannot succeed."""
    lowered = message.lower()
    return any(phrase in lowered for phrase in _PERMANENT)


async def run_bd(
    command: Sequence[str], args: Sequence[str], *, cwd: Path, timeout: float = TIMEOUT_SECONDS
) -> BdResult:
    """Run ``command + args`` in ``cwd``; BdError when it cannot start or does not finish."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            *args,
            cwd=str(cwd),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise BdError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError) as exc:
        if proc.returncode is None:
            proc.kill()
        await asyncio.shield(proc.wait())
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise BdError(f"bd {' '.join(args[:2])} timed out after {timeout:.0f}s") from None
    return BdResult(
        proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
    )
