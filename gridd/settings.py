"""Settings: ``.grid/config.toml`` parsed once, validated, and passed down explicitly.

Every field has a default and is documented in docs/configuration.md. Config keys are
snake_case; unknown keys are rejected so a typo never silently does nothing.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gridd.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DaemonSettings(_Section):
    """How the daemon process itself behaves."""

    log_level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    log_max_bytes: int = Field(10 * 1024 * 1024, ge=4096, description="Rotate gridd.log at this size")
    log_backups: int = Field(3, ge=0, le=100, description="Rotated log files to keep")
    shutdown_timeout_seconds: float = Field(
        3.0, gt=0, le=60, description="Grace for open connections at shutdown"
    )


class EventSettings(_Section):
    """The durable event log and the SSE stream."""

    retain: int = Field(200_000, ge=100, description="Events kept in the log; older are pruned")
    subscriber_queue: int = Field(
        4096, ge=16, description="Events buffered per SSE client before it is dropped"
    )
    send_timeout_seconds: float = Field(
        10.0, gt=0, description="A client that cannot take one event in this time is dropped"
    )
    keepalive_seconds: float = Field(15.0, gt=0, le=15, description="SSE comment interval")
    snapshot_seconds: float = Field(30.0, gt=0, description="state.snapshot interval per stream")


class Settings(_Section):
    """All of gridd's settings, grouped by the part of the daemon they steer."""

    daemon: DaemonSettings = DaemonSettings()
    events: EventSettings = EventSettings()


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def parse_settings(data: dict[str, Any], *, source: str = "config") -> Settings:
    """Validate a parsed config mapping; errors name the key and the problem."""
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = [
            {"key": _format_loc(err["loc"]), "problem": err["msg"]} for err in exc.errors()
        ]
        first = problems[0]
        raise ConfigError(
            f"{source}: invalid value for '{first['key']}': {first['problem']}",
            details={"source": source, "problems": problems},
        ) from None


def load_settings(path: Path) -> Settings:
    """Read ``config.toml``; a missing file means all defaults."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Settings()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", details={"source": str(path)}) from None
    return parse_settings(data, source=str(path))
