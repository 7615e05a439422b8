"""Settings: read once from ``.grid/config.toml``; every mistake names the key and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from gridd.errors import ConfigError
from gridd.settings import Settings, load_settings, parse_settings
from tests.support.cli import run_gridd
from tests.support.repos import write_config


def test_missing_config_file_means_documented_defaults(tmp_path: Path) -> None:
    settings = load_settings(tmp_path / "config.toml")
    assert settings == Settings()
    assert settings.events.keepalive_seconds <= 15
    assert settings.events.snapshot_seconds == 30
    assert settings.events.retain >= 100


def test_config_file_values_override_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "[events]\nretain = 100\nkeepalive_seconds = 0.2\nsnapshot_seconds = 0.1\n"
        '[daemon]\nlog_level = "DEBUG"\n'
    )
    settings = load_settings(path)
    assert settings.events.retain == 100
    assert settings.events.keepalive_seconds == 0.2
    assert settings.events.snapshot_seconds == 0.1
    assert settings.daemon.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[events]\nretian = 5\n", "events.retian", "did you mean 'retain'?"),
        ("[bogus]\nx = 1\n", "bogus", "(known: daemon, events,"),
        ("[agents.mine]\ncommand = ['x']\nadaptr = 'y'\n", "agents.mine.adaptr", "'adapter'?"),
        ('[events]\nretain = "lots"\n', "events.retain", "valid integer"),
        ("[events]\nretain = 5\n", "events.retain", "greater than or equal to 100"),
        ("[events]\nkeepalive_seconds = 60\n", "events.keepalive_seconds", "less than or equal"),
        ("[events]\nsnapshot_seconds = 0\n", "events.snapshot_seconds", "greater than or equal"),
        ('[daemon]\nlog_level = "LOUD"\n', "daemon.log_level", "pattern"),
        ("events = 3\n", "events", "valid dictionary"),
    ],
)
def test_invalid_config_names_the_key_and_the_problem(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    err = info.value
    assert f"'{key}'" in err.message
    assert problem in err.message
    assert str(path) in err.message
    assert err.details["problems"][0]["key"] == key
    assert err.code == "config_invalid"


def test_every_problem_is_listed_not_just_the_first() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"events": {"retain": 1, "subscriber_queue": 1}, "daemon": {"x": 1}})
    keys = {p["key"] for p in info.value.details["problems"]}
    assert keys == {"events.retain", "events.subscriber_queue", "daemon.x"}


def test_invalid_toml_is_reported_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[events\nretain = 100\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "not valid TOML" in info.value.message
    assert "line 1" in info.value.message


def test_config_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b"[events]\nretain = 100 # \xff\xfe\n")
    with pytest.raises(ConfigError):
        load_settings(path)


def test_settings_are_immutable_once_built() -> None:
    settings = Settings()
    with pytest.raises(ValueError):
        settings.events.retain = 5  # type: ignore[misc]


def test_an_unknown_adapter_stops_the_daemon_naming_the_profile_key(repo: Path) -> None:
    write_config(repo, '[agents.odd]\ncommand = ["true"]\nadapter = "nope"\n')
    proc = run_gridd(repo)
    assert proc.returncode == 1
    assert "agents.odd.adapter" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (repo / ".grid" / "gridd.sock").exists()


SECTIONS = [
    field.annotation
    for field in Settings.model_fields.values()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
]


@pytest.mark.parametrize("section", SECTIONS, ids=lambda section: section.__name__)
def test_a_section_left_out_of_the_config_equals_one_validated_from_nothing(
    section: type[BaseModel],
) -> None:
    # Left-out sections are made with model_construct (no validator is built for them):
    # their defaults must be exactly what validating an empty table gives.
    assert section.model_construct() == section.model_validate({})


def test_settings_made_from_no_config_equal_settings_validated_from_nothing() -> None:
    assert len(SECTIONS) == 9
    assert Settings.model_construct() == Settings.model_validate({})


def test_one_section_in_the_config_leaves_the_others_at_their_defaults() -> None:
    settings = parse_settings({"merge": {"strategy": "squash"}})
    assert settings.merge.strategy == "squash"
    assert settings.daemon == Settings().daemon
    assert settings.events.retain == Settings().events.retain
    assert settings.profiles().keys() >= {"example", "claude"}


def test_agents_in_the_config_are_validated_profile_by_profile() -> None:
    settings = parse_settings({"agents": {"mine": {"command": ["true"], "concurrency": 2}}})
    assert settings.agents["mine"].concurrency == 2
    with pytest.raises(ConfigError) as info:
        parse_settings({"agents": {"mine": {"command": []}}})
    assert info.value.details["problems"][0]["key"] == "agents.mine.command"


def test_a_table_for_a_builtin_profile_without_a_command_changes_only_what_it_sets() -> None:
    """``[agents.claude.sandbox]`` alone (what ``gridctl init`` writes) sandboxes the
    built-in claude profile; a table that names its command is a profile of its own."""
    settings = parse_settings({"agents": {"claude": {"sandbox": {"mode": "workspace"}}}})
    claude = settings.profiles()["claude"]
    assert claude.command[0] == "claude" and claude.adapter == "claude"
    assert claude.adapter_options == {"permission_prompt_tool": "stdio"}
    assert claude.sandbox.mode == "workspace"
    assert Settings.model_validate({"agents": {"claude": {"timeout_seconds": 9}}}).agents[
        "claude"
    ].command[0] == ("claude")
    own = parse_settings({"agents": {"claude": {"command": ["my-claude"]}}}).agents["claude"]
    assert (own.command, own.adapter) == (["my-claude"], "heartbeat")
    with pytest.raises(ConfigError, match=r"agents\.mine\.command"):
        parse_settings({"agents": {"mine": {"sandbox": {"mode": "workspace"}}}})
