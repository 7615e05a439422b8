"""A workspace whose tasks come from beads: the fake ``bd`` (tests/fakes/bd) and its data
file, which a benchmark fills the way a commit would. Shared by the beads benchmarks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.common import ROOT, make_repo

#: The fake ``bd`` command, as gridd's ``[beads] command`` runs it.
BD = [sys.executable, "-I", "-S", str(ROOT / "tests" / "fakes" / "bd")]


def bead(bead_id: str) -> dict[str, Any]:
    return {
        "id": bead_id,
        "title": f"bead {bead_id}",
        "description": "write one file",
        "status": "open",
        "priority": 2,
        "issue_type": "task",
        "created_at": "2026-11-23T00:00:00Z",
        "updated_at": "2026-11-23T00:00:00Z",
    }


def add_bead(root: Path, bead_id: str) -> None:
    """Land a new ready bead in bd's data the way a commit does: one atomic rename."""
    add_beads(root, [bead_id])


def add_beads(root: Path, bead_ids: list[str]) -> None:
    db_path = root / ".beads" / "fake-bd.json"
    db = json.loads(db_path.read_text())
    db["issues"].extend(bead(b) for b in bead_ids)
    tmp = db_path.with_name("incoming.tmp")
    tmp.write_text(json.dumps(db))
    os.replace(tmp, db_path)


def beads_repo() -> Path:
    root = make_repo()
    (root / ".beads").mkdir()
    (root / ".beads" / "fake-bd.json").write_text(json.dumps({"issues": []}))
    return root
