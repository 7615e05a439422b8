"""The docs name only what exists: every relative link, module or file path, endpoint,
``gridctl`` command and flag, and config key that README.md and docs/*.md name is checked
against the repository and the code (events.md's event types are held by test_event_types).

What a doc names in backticks is read by its shape: ``GET /tasks/{id}`` is an endpoint,
``gridctl task add --depends-on`` a command with a flag, ``[merge] hold_overlapping`` and
``scheduler.max_agents`` config keys, ``gridd/store.py``, ``store.py`` and
``gridd.runs.shim`` code, ``Background.spawn`` a class's attribute. Anything else is prose.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from gridd.cli.gridctl import build_parser
from gridd.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ROOT / "README.md",
    ROOT / "contrib" / "README.md",
    ROOT / "contrib" / "vscode" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
CODE = ROOT / "gridd"

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_TICKS = re.compile(r"`([^`\n]+)`")
_ENDPOINT = re.compile(r"^(GET|POST|PUT|PATCH|DELETE|HEAD) (/[^\s?]*)")
_SECTION_KEY = re.compile(r"^\[([a-z_]+)\] ([a-z_]+)(?: = .*)?$")
_PY_FILE = re.compile(r"^(?:gridd/)?([a-z_]+/)*[a-z_]+\.py$")
_DOTTED_CODE = re.compile(r"^gridd(\.[a-z_]+)+$")
#: ``gridd.sock``, ``gridd.db.id``: files under .grid/, not modules.
_STATE_FILES = {"sock", "pid", "log", "db", "out", "lock"}
_DOTTED = re.compile(r"^(?!gridd\.)[a-z_]+(\.[a-z_]+)+$")
_CLASS_ATTR = re.compile(r"^([A-Z][A-Za-z]+)\.([a-z_]+)(?:\(\))?$")


def mentions() -> Iterator[tuple[Path, int, str]]:
    """Every backticked text of the docs, with its file and line (code blocks skipped)."""
    for doc in DOCS:
        fenced = False
        for number, line in enumerate(doc.read_text().splitlines(), start=1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                for match in _TICKS.finditer(line):
                    yield doc, number, match.group(1).strip()


def where(doc: Path, number: int) -> str:
    return f"{doc.relative_to(ROOT)}:{number}"


# -- links ---------------------------------------------------------------------------------------


def test_every_relative_link_points_at_a_file_in_the_repository() -> None:
    wrong = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), start=1):
            for target in _LINK.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                path = (doc.parent / target.split("#", 1)[0]).resolve()
                if not path.is_relative_to(ROOT) or not path.exists():
                    wrong.append(f"{where(doc, number)}: {target}")
    assert not wrong, "links to nothing in the repository:\n" + "\n".join(wrong)


# -- code ----------------------------------------------------------------------------------------


@cache
def python_files() -> list[str]:
    return [
        str(p.relative_to(ROOT))
        for top in ("gridd", "tests", "bench", "contrib")
        for p in (ROOT / top).rglob("*.py")
        if "node_modules" not in p.parts
    ]


@cache
def classes() -> dict[str, set[str]]:
    """Class name -> the names it defines (methods, attributes) or inherits from a class of
    gridd's (``Store`` from ``Writes`` and the others of ``gridd/store/``), over all of gridd."""
    found: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for path in CODE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = found.setdefault(node.name, set())
                bases.setdefault(node.name, set()).update(
                    b.id for b in node.bases if isinstance(b, ast.Name)
                )
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                # ``self.x = ...`` anywhere in its methods
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self"
                        and isinstance(sub.ctx, ast.Store)
                    ):
                        names.add(sub.attr)

    def inherited(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        own = set(found.get(name, set()))
        for base in bases.get(name, set()) - seen - {name}:
            own |= inherited(base, seen | {name})
        return own

    return {name: inherited(name) for name in found}


def code_problem(text: str) -> str | None:
    if _PY_FILE.match(text):
        if not any(f == text or f.endswith(f"/{text}") for f in python_files()):
            return "no such file"
    elif _DOTTED.match(text) and not _is_other_name(text):
        # ``runs.shim``, ``health.assess``: a module of gridd's, or a name in one.
        first, *rest = text.split(".")
        package, module = CODE / first, (CODE / first).with_suffix(".py")
        nested = [p for p in CODE.rglob(f"{first}.py")]
        if not package.is_dir() and not module.is_file() and len(nested) == 1:
            module = nested[0]
        if not package.is_dir() and not module.is_file():
            return None  # not a module of gridd's: another program's, a file, prose
        if package.is_dir() and not (
            (package / f"{rest[0]}.py").exists() or (package / rest[0]).is_dir()
        ):
            init = package / "__init__.py"
            if not re.search(rf"\b{rest[0]}\b", init.read_text() if init.exists() else ""):
                return f"{package.relative_to(ROOT)}/ has no {rest[0]}"
        elif module.is_file() and not re.search(rf"\b{rest[0]}\b", module.read_text()):
            return f"{module.relative_to(ROOT)} has no {rest[0]}"
    elif _DOTTED_CODE.match(text) and text.split(".")[1] not in _STATE_FILES:
        parts = text.split(".")
        module = CODE.joinpath(*parts[1:])
        if not (module.with_suffix(".py").exists() or (module / "__init__.py").exists()):
            parent = CODE.joinpath(*parts[1:-1]).with_suffix(".py")
            if not (parent.exists() and re.search(rf"\b{parts[-1]}\b", parent.read_text())):
                return "no such module"
    elif match := _CLASS_ATTR.match(text):
        name, attr = match.groups()
        if name in classes() and attr not in classes()[name]:
            return f"class {name} has no {attr}"
    return None


def test_every_module_file_and_class_attribute_named_exists() -> None:
    wrong = [
        f"{where(doc, number)}: `{text}`: {problem}"
        for doc, number, text in mentions()
        if (problem := code_problem(text))
    ]
    assert not wrong, "\n".join(wrong)


def _is_other_name(text: str) -> bool:
    """An event type, a config key or a field of a document, not code."""
    from gridd import event_types

    first = text.split(".")[0]
    return (
        text in event_types.ALL
        or text.split(".")[-1] in _EXTENSIONS
        or (first in Settings.model_fields and first != "agents")
        or first == "gridd"
        or text in NOT_CODE
        or first in _GIT_CONFIG
    )


#: ``heartbeat.ndjson``, ``spec.marshal``: files, not code.
_EXTENSIONS = {"py", "md", "toml", "json", "ndjson", "yaml", "db", "log", "sock", "idx", "lock"}
_EXTENSIONS |= {"marshal", "kill", "service", "plist"}

#: ``core.fsmonitor``, ``user.email``: git's configuration.
_GIT_CONFIG = {"core", "user", "gc", "remote", "branch", "submodule", "safe"}

#: Dotted names that are fields of a document (``GET /state``'s ``daemon.warnings``).
NOT_CODE = {"daemon.warnings"}


# -- endpoints -----------------------------------------------------------------------------------


def test_every_endpoint_named_is_served() -> None:
    import gridd.api.app  # noqa: F401  (registers every endpoint in the table)
    from gridd.api.spec import table

    served = {(e.method, re.sub(r"\{[^}]+\}", "{}", e.path)) for e in table.endpoints}
    served |= {("HEAD", path) for method, path in served if method == "GET"}
    wrong = []
    for doc, number, text in mentions():
        if match := _ENDPOINT.match(text):
            if "%" in text:
                continue  # an example of a refused path
            method = match.group(1)
            path = re.sub(r"\{[^}]+\}|<[^>]+>", "{}", match.group(2))
            if (method, path.rstrip("/") or "/") not in served:
                wrong.append(f"{where(doc, number)}: `{text}`")
    assert not wrong, "endpoints gridd does not serve:\n" + "\n".join(wrong)


# -- gridctl -------------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def gridctl_problem(text: str) -> str | None:
    """What is wrong with ``gridctl WORDS --flags`` as a command line, if anything."""
    parser = build_parser()
    words = text.split()[1:]
    path = ["gridctl"]
    flags: set[str] = set()
    for word in words:
        if word.startswith("--"):
            flag = word.split("=", 1)[0].rstrip(",.;:)")
            known = {o for a in parser._actions for o in a.option_strings}
            if flag not in known:
                return f"{' '.join(path)} has no {flag}"
            flags.add(flag)
            continue
        children = _subparsers(parser)
        if not children:
            continue  # an argument
        if word in children:
            parser = children[word]
            path.append(word)
        elif re.fullmatch(r"[a-z]+", word) and not word.isupper():
            if word in {"ACTION", "COMMAND"} or (path != ["gridctl"] and "|" in text):
                continue
            return f"{' '.join(path)} has no command {word!r}"
        else:
            return None  # a placeholder (ID, <task>, ...): the rest is not checkable
    return None


def test_every_gridctl_command_and_flag_named_exists() -> None:
    wrong = []
    for doc, number, text in mentions():
        command = text.startswith("gridctl ") and "|" not in text and "..." not in text
        if command and (problem := gridctl_problem(text)):
            wrong.append(f"{where(doc, number)}: `{text}`: {problem}")
    assert not wrong, "\n".join(wrong)


# -- config keys ---------------------------------------------------------------------------------


def config_problem(section: str, key: str) -> str | None:
    field = Settings.model_fields.get(section)
    if field is None:
        return f"no section [{section}]"
    model = field.annotation
    if isinstance(model, type) and issubclass(model, BaseModel) and key not in model.model_fields:
        return f"[{section}] has no key {key!r}"
    return None


def _not_config(text: str) -> bool:
    from gridd import event_types

    return text in event_types.ALL or text.endswith(".py") or text in NOT_CODE


def test_every_config_key_named_exists() -> None:
    sections = {name for name, f in Settings.model_fields.items()}
    wrong = []
    for doc, number, text in mentions():
        found = _SECTION_KEY.match(text)
        if found is None and re.fullmatch(r"[a-z_]+\.[a-z_]+", text) and not _not_config(text):
            section, key = text.split(".")
            found = re.match(r"(.*) (.*)", f"{section} {key}") if section in sections else None
        checked = found is not None and found.group(1) != "agents"
        if found is not None and checked and (problem := config_problem(*found.groups()[:2])):
            wrong.append(f"{where(doc, number)}: `{text}`: {problem}")
    assert not wrong, "\n".join(wrong)


# -- lists that claim to be complete -----------------------------------------------------------


def _table_names(doc: Path, heading: str) -> set[str]:
    """The first column of the first table under ``heading``."""
    text = doc.read_text()
    section = text[text.index(heading) :]
    rows = re.findall(r"^\| `([^`]+)` \|", section.split("\n## ", 1)[0], flags=re.M)
    return set(rows)


def _doctor_checks() -> set[str]:
    """The name of every check ``gridctl doctor`` makes (``binary <name>`` for f-strings)."""
    names = set()
    for path in (CODE / "cli").glob("doctor*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Check":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names.add(first.value)
                elif isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant):
                    names.add(f"{first.values[0].value}<name>")
    return names


def test_operations_lists_every_doctor_check_and_no_other() -> None:
    listed = _table_names(ROOT / "docs" / "operations.md", "## Checking a machine")
    assert listed == _doctor_checks()


def test_architecture_lists_every_supervised_part_once() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## The supervisor") :].split("\n## ", 1)[0]
    cells = re.findall(r"^\| ((?:`[a-z-]+`(?:, )?)+) \|", section, flags=re.M)
    listed = [name for cell in cells for name in re.findall(r"`([a-z-]+)`", cell)]
    supervised = set()
    for path in CODE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "supervise":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    supervised.add(first.value)
    assert sorted(listed) == sorted(supervised)


@pytest.mark.parametrize("text", ["gridd/nothing.py", "gridd.nothing", "Background.nothing"])
def test_the_checks_catch_a_name_that_does_not_exist(text: str) -> None:
    assert code_problem(text) is not None
    assert gridctl_problem("gridctl task add --no-such-flag") is not None
    assert config_problem("scheduler", "no_such_key") is not None
