"""The HTTP API served on the workspace's Unix socket (Starlette)."""

from __future__ import annotations

from gridd.api.app import create_app

__all__ = ["create_app"]
