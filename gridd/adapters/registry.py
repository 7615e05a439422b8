"""Which adapter a profile's ``adapter`` name means, and its options checked once, up front.

    heartbeat, plain   HeartbeatAdapter (no options): the default for any command
    claude             ClaudeAdapter: {"permission_prompt_tool"?: "stdio"}, set when the
                       command passes ``--permission-prompt-tool stdio``;
                       {"permission_mode"?: default|acceptEdits|plan|bypassPermissions,
                       "allowed_tools"?: [rule], "disallowed_tools"?: [rule]}, passed to
                       the CLI; {"stall_nudge"?: bool (true)}: a stall first sends "continue"
    codex              CodexAdapter: {"model"?: str}, passed as ``-m`` unless the command
                       names a model (the price table needs it: codex reports only tokens)
    gemini             GeminiAdapter (no options)
    opencode           OpencodeAdapter (no options)
    patterns           PatternsAdapter: {"pack": str, "auto_answer"?: {pattern id: response},
                       "send_prompt"?: bool}

Every call returns a fresh instance: adapters keep per-run state and are never shared. An
adapter's module is imported by its factory, when a profile using it is first checked or
run: a daemon at rest has not loaded adapters no agent uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gridd.errors import ConfigError

if TYPE_CHECKING:
    from gridd.adapters.base import Adapter


def _heartbeat(options: dict[str, Any]) -> Adapter:
    from gridd.adapters.heartbeat import HeartbeatAdapter

    _only(options, set(), "heartbeat")
    return HeartbeatAdapter()


def _plain(options: dict[str, Any]) -> Adapter:
    from gridd.adapters.heartbeat import HeartbeatAdapter

    _only(options, set(), "plain")
    return HeartbeatAdapter(name="plain")


def _claude(options: dict[str, Any]) -> Adapter:
    from gridd.adapters.claude import PERMISSION_MODES, ClaudeAdapter

    _only(
        options,
        {
            "permission_prompt_tool",
            "permission_mode",
            "allowed_tools",
            "disallowed_tools",
            "stall_nudge",
        },
        "claude",
    )
    tool = options.get("permission_prompt_tool")
    if tool not in (None, "stdio"):
        raise ConfigError(
            "permission_prompt_tool is 'stdio' (as passed to claude) or absent",
            details={"key": "permission_prompt_tool"},
        )
    mode = options.get("permission_mode")
    if mode is not None and mode not in PERMISSION_MODES:
        raise ConfigError(
            f"permission_mode is one of {', '.join(PERMISSION_MODES)}",
            details={"key": "permission_mode", "allowed": list(PERMISSION_MODES)},
        )
    nudge = options.get("stall_nudge", True)
    if not isinstance(nudge, bool):
        raise ConfigError("stall_nudge is true or false", details={"key": "stall_nudge"})
    return ClaudeAdapter(
        stall_nudge=nudge,
        permission_prompt_tool=tool,
        permission_mode=mode,
        allowed_tools=_tool_list(options, "allowed_tools"),
        disallowed_tools=_tool_list(options, "disallowed_tools"),
    )


def _codex(options: dict[str, Any]) -> Adapter:
    from gridd.adapters.codex import CodexAdapter

    _only(options, {"model"}, "codex")
    model = options.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ConfigError("model is a model name, e.g. gpt-5-codex", details={"key": "model"})
    return CodexAdapter(model=model)


def _gemini(options: dict[str, Any]) -> Adapter:
    from gridd.adapters.gemini import GeminiAdapter

    _only(options, set(), "gemini")
    return GeminiAdapter()


def _opencode(options: dict[str, Any]) -> Adapter:
    from gridd.adapters.opencode import OpencodeAdapter

    _only(options, set(), "opencode")
    return OpencodeAdapter()


def _tool_list(options: dict[str, Any], key: str) -> list[str]:
    value = options.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(
            f'{key} is a list of Claude tool rules, e.g. ["Bash(git diff:*)", "Edit"]',
            details={"key": key},
        )
    return list(value)


def _patterns(options: dict[str, Any]) -> Adapter:
    from gridd.adapters.patterns import PatternsAdapter

    _only(options, {"pack", "auto_answer", "send_prompt"}, "patterns")
    pack = options.get("pack")
    if not isinstance(pack, str) or not pack:
        raise ConfigError("the patterns adapter needs a 'pack' name", details={"key": "pack"})
    auto = options.get("auto_answer", {})
    if not isinstance(auto, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in auto.items()
    ):
        raise ConfigError(
            "auto_answer maps pattern ids to responses (strings)", details={"key": "auto_answer"}
        )
    send_prompt = options.get("send_prompt", False)
    if not isinstance(send_prompt, bool):
        raise ConfigError("send_prompt is true or false", details={"key": "send_prompt"})
    return PatternsAdapter(pack=pack, auto_answer=auto, send_prompt=send_prompt)


FACTORIES: dict[str, Callable[[dict[str, Any]], Adapter]] = {
    "heartbeat": _heartbeat,
    "plain": _plain,
    "claude": _claude,
    "codex": _codex,
    "gemini": _gemini,
    "opencode": _opencode,
    "patterns": _patterns,
}
ADAPTER_NAMES = tuple(FACTORIES)


def get_adapter(name: str, *, options: dict[str, Any] | None = None) -> Adapter:
    """A new adapter for one agent run; ConfigError for an unknown name or bad options."""
    factory = FACTORIES.get(name)
    if factory is None:
        raise ConfigError(
            f"unknown adapter {name!r} (known: {', '.join(ADAPTER_NAMES)})",
            details={"adapter": name, "known": list(ADAPTER_NAMES)},
        )
    return factory(dict(options or {}))


def _only(options: dict[str, Any], allowed: set[str], name: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(
            f"adapter {name!r} has no option {unknown[0]!r}",
            details={"adapter": name, "unknown": unknown, "allowed": sorted(allowed)},
        )
