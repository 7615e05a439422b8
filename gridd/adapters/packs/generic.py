"""Prompts most plain CLIs print while they wait for a yes/no or a numbered choice.

Turned on by a profile with ``adapter = "patterns"`` and ``adapter_options = {pack =
"generic"}``. Only these exact shapes count, as the whole waiting line (no newline after it,
ANSI and controls removed; ``patterns.py``):

- ``<question> (y/n)``, ``[y/n]``, ``[Y/n]``, ``[y/N]``, ``(Y/n)``, ``(y/N)``, optionally
  followed by ``:`` or ``?``, and a space: answered ``y`` or ``n``;
- ``<question> (yes/no)`` or ``[yes/no]``, the same way: answered ``yes`` or ``no``;
- ``<question> [1] <first> [2] <second> ...:``: two to nine choices on the line, numbered
  from 1 in order, ended by ``:``, ``?`` or ``>`` (and a space): answered with the choice's
  number. The options are the choices' own words (``"options": "numbered"``). The end mark
  is required: without it, a prompt still being printed ("[2] bl") would already match.

A question mark alone, a prompt quoted mid-line or followed by more output, a list numbered
out of order or from 0, are never prompts.

Data only: ``gridd.adapters.patterns`` compiles and validates it. Raise ``VERSION`` whenever a
pattern changes meaning, so a profile's ``auto_answer`` can be reviewed against it.
"""

from __future__ import annotations

from typing import Any

VERSION = 1

_QUESTION = r"(?P<question>\S(?:.{0,400}\S)?)"
_END = r"[:?]? ?"

PACK: dict[str, Any] = {
    "name": "generic",
    "version": VERSION,
    "cli": "any line-oriented CLI's yes/no and numbered-choice prompts",
    "patterns": [
        {
            "id": "generic.yes_no",
            "regex": _QUESTION + r" (?:\((?:y/n|Y/n|y/N)\)|\[(?:y/n|Y/n|y/N)\])" + _END,
            "type": "decision",
            "subject": False,
            "options": [{"label": "yes", "send": "y\n"}, {"label": "no", "send": "n\n"}],
        },
        {
            "id": "generic.yes_no_words",
            "regex": _QUESTION + r" (?:\(yes/no\)|\[yes/no\])" + _END,
            "type": "decision",
            "subject": False,
            "options": [{"label": "yes", "send": "yes\n"}, {"label": "no", "send": "no\n"}],
        },
        {
            "id": "generic.numbered",
            "regex": r"(?:(?P<question>\S(?:.{0,400}?\S)?) )?"
            r"(?P<choices>\[1\] [^\[\]]*?[^\[\]\s](?: \[[2-9]\] [^\[\]]*?[^\[\]\s]){1,8})"
            r"[:?>] ?",
            "type": "decision",
            "subject": False,
            "options": "numbered",
        },
    ],
}
