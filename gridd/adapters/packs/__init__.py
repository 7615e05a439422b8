"""Versioned pattern packs for the ``patterns`` adapter, one module per CLI.

A pack is plain data: ``{"name", "version", "cli", "patterns": [{"id", "regex", "type",
"subject", "options": [{"label", "send", "when"?}] or "numbered"}]}``. ``regex`` must match the whole
prompt line (after ANSI sequences and control characters are removed) exactly as the CLI
prints it while it waits; patterns are tried in order, the first match wins. An option with
``when`` is offered only when the regex group of that name took part in the match.
``"options": "numbered"`` takes the options from the prompt itself: its ``choices`` group
holds ``[1] first [2] second ...``, numbered from 1 in order; each is answered with its
number.
"""

from __future__ import annotations

from typing import Any

from gridd.adapters.packs import aider, generic

PACKS: dict[str, dict[str, Any]] = {
    "aider": aider.PACK,
    "generic": generic.PACK,
}

__all__ = ["PACKS"]
