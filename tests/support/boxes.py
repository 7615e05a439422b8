"""Boxes a test made: they outlive a daemon (as containers do), so a test removes them."""

from __future__ import annotations

from gridd.runs.boxes import Engine


def remove_boxes(engine: Engine) -> None:
    """Remove every box ``engine`` still has."""
    for box in engine.find({}):
        engine.remove(box.name)
