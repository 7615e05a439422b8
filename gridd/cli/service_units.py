"""Service unit files for one workspace, rendered from the templates in ``gridd/units/``.

Pure functions: a template, a workspace path and the gridd command in, a file name and
its text out. The templates are package data and ``contrib/`` links to the same files, so
the hand-installed units and ``gridctl service install`` cannot drift apart.

- systemd: the file is an *instance* of the ``gridd@.service`` template, named
  ``gridd@<systemd-escape --path WORKSPACE>.service``, so ``%f`` in it still resolves to the
  workspace; only ``ExecStart``'s program and ``PATH`` are replaced by what is installed.
- launchd: ``dev.gridd.<name>.plist`` with the template's placeholders filled in and checked
  by ``plistlib``.
"""

from __future__ import annotations

import hashlib
import plistlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

SYSTEMD_TEMPLATE = "gridd@.service"
LAUNCHD_TEMPLATE = "dev.gridd.plist"
#: The program the templates name; the generator puts the installed gridd there instead.
TEMPLATE_GRIDD = "%h/.local/bin/gridd"
_PLAIN = re.compile(r"[A-Za-z0-9:_.]")


@dataclass(frozen=True)
class UnitFile:
    """A rendered unit: its file name, its text, and the name the manager knows it by."""

    filename: str
    text: str
    label: str


def template(name: str) -> str:
    return resources.files("gridd").joinpath("units", name).read_text(encoding="utf-8")


def systemd_escape_path(path: Path) -> str:
    """What ``systemd-escape --path`` prints for an absolute, normalised path."""
    stripped = str(path).strip("/")
    if not stripped:
        return "-"
    out = []
    for index, char in enumerate(stripped):
        if char == "/":
            out.append("-")
        elif _PLAIN.fullmatch(char) and not (index == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode())
    return "".join(out)


def systemd_word(text: str) -> str:
    """One argument for ``ExecStart=``/``Environment=``: specifiers and variables escaped,
    quoted when it holds a space, a quote or a backslash."""
    text = text.replace("%", "%%").replace("$", "$$")
    if re.search(r"[\s\"'\\;]", text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _body(text: str, first: str) -> str:
    """The template without its how-to-install comment: from its first ``first`` line on."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    return "".join(lines[start:])


def render_systemd(*, root: Path, gridd: list[str], path_env: str, version: str) -> UnitFile:
    name = f"gridd@{systemd_escape_path(root)}.service"
    body = _body(template(SYSTEMD_TEMPLATE), "[Unit]")
    program = " ".join(systemd_word(part) for part in gridd)
    if TEMPLATE_GRIDD not in body:
        raise ValueError(f"{SYSTEMD_TEMPLATE} no longer names {TEMPLATE_GRIDD} in ExecStart")
    body = body.replace(TEMPLATE_GRIDD, program, 1)
    body = re.sub(r"^# Adjust the path to where gridd is installed.*\n", "", body, flags=re.M)
    body = re.sub(
        r"^Environment=PATH=.*$",
        lambda _: "Environment=" + systemd_word(f"PATH={path_env}"),
        body,
        count=1,
        flags=re.M,
    )
    header = (
        f"# Written by 'gridctl service install' (gridd {version}) for {root},\n"
        f"# from gridd's {SYSTEMD_TEMPLATE} (also contrib/systemd/). Remove it with\n"
        f"# 'gridctl service uninstall'. PATH is the installing shell's.\n\n"
    )
    return UnitFile(filename=name, text=header + body, label=name)


def launchd_name(root: Path) -> str:
    """A short, unique, label-safe name: the directory's name and a hash of the path."""
    slug = re.sub(r"[^A-Za-z0-9-]+", "-", root.name).strip("-").lower() or "workspace"
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    return f"{slug[:40]}-{digest}"


def render_launchd(*, root: Path, gridd: list[str], home: Path, version: str) -> UnitFile:
    name = launchd_name(root)
    text = template(LAUNCHD_TEMPLATE)
    text = re.sub(r"<!--\n  gridd for one workspace.*?-->\n", "", text, count=1, flags=re.S)
    program = "\n".join(f"        <string>{xml_escape(part)}</string>" for part in gridd)
    text = text.replace("        <string>__GRIDD__</string>", program, 1)
    for placeholder, value in (
        ("__NAME__", name),
        ("__HOME__", str(home)),
        ("__WORKSPACE__", str(root)),
    ):
        text = text.replace(placeholder, xml_escape(value))
    text = text.replace(
        "<plist version",
        f"<!-- Written by 'gridctl service install' (gridd {version}) for"
        f" {xml_escape(str(root)).replace('--', '- -')}. -->\n<plist version",
        1,
    )
    plistlib.loads(text.encode())  # a template edit that breaks the plist fails here
    label = f"dev.gridd.{name}"
    return UnitFile(filename=f"{label}.plist", text=text, label=label)
