"""aider's confirmation prompts, as ``InputOutput.confirm_ask`` prints them.

Source: Aider-AI/aider ``aider/io.py`` ``confirm_ask`` builds every prompt as
``question + " (Y)es/(N)o" [+ "/(A)ll"] [+ "/(S)kip all"] [+ "/(D)on't ask again"]
+ " [Yes]: "`` (``[No]: `` when the default is no) and waits on that same line; ``(A)ll`` and
``(S)kip all`` appear when a ConfirmGroup holds more than one item (``(A)ll`` not when an
explicit yes is required), ``(D)on't ask again`` when ``allow_never``. It reads the first
letter of the answer. The questions and their subjects (printed on the line before) are from
``aider/coders/base_coder.py`` (``check_for_file_mentions``, ``allowed_to_edit``,
``handle_shell_commands``, ``check_for_urls``, lint/test reflection), ``aider/io.py``
(``offer_url``), ``aider/commands.py`` (``/run``) and ``aider/main.py``
(``check_gitignore``). Transcripts that show them: ``tests/transcripts/aider-*.txt``.

Data only: ``gridd.adapters.patterns`` compiles and validates it. Raise ``VERSION`` whenever a
pattern changes meaning, so a profile's ``auto_answer`` can be reviewed against it.
"""

from __future__ import annotations

from typing import Any

VERSION = 1

_CHOICES = (
    r" \(Y\)es/\(N\)o(?P<all>/\(A\)ll)?(?P<skip>/\(S\)kip all)?"
    r"(?P<never>/\(D\)on't ask again)? \[(?:Yes|No)\]: ?"
)

_OPTIONS: list[dict[str, Any]] = [
    {"label": "yes", "send": "y\n"},
    {"label": "no", "send": "n\n"},
    {"label": "all", "send": "a\n", "when": "all"},
    {"label": "skip all", "send": "s\n", "when": "skip"},
    {"label": "don't ask again", "send": "d\n", "when": "never"},
]


def _confirm(pattern_id: str, question: str, kind: str, *, subject: bool) -> dict[str, Any]:
    return {
        "id": pattern_id,
        "regex": f"(?P<question>{question})" + _CHOICES,
        "type": kind,
        "subject": subject,
        "options": _OPTIONS,
    }


PACK: dict[str, Any] = {
    "name": "aider",
    "version": VERSION,
    "cli": "aider (aider-chat), InputOutput.confirm_ask prompts",
    "patterns": [
        _confirm("aider.add_file", r"Add file to the chat\?", "decision", subject=True),
        _confirm("aider.create_file", r"Create new file\?", "permission", subject=True),
        _confirm(
            "aider.edit_unadded_file",
            r"Allow edits to file that has not been added to the chat\?",
            "permission",
            subject=True,
        ),
        _confirm("aider.run_shell", r"Run shell commands?\?", "permission", subject=True),
        _confirm(
            "aider.add_command_output",
            r"Add command output to the chat\?",
            "decision",
            subject=False,
        ),
        _confirm("aider.add_url", r"Add URL to the chat\?", "decision", subject=True),
        _confirm(
            "aider.open_url",
            r"Open (?:documentation )?(?:url|URL) for more info\?",
            "decision",
            subject=True,
        ),
        _confirm("aider.fix_lint", r"Attempt to fix lint errors\?", "decision", subject=False),
        _confirm("aider.fix_tests", r"Attempt to fix test errors\?", "decision", subject=False),
        _confirm(
            "aider.gitignore",
            r"Add \S+ to \.gitignore \(recommended\)\?",
            "decision",
            subject=False,
        ),
        # Any other question in confirm_ask's exact form: the choice suffix is aider's own,
        # so this still matches only aider's prompts, never free text ending in "?". A
        # question never quotes (so a line quoting a prompt is not one) and ends in "?".
        _confirm("aider.confirm", r"[A-Z][^\n\"`]{0,300}\?", "decision", subject=False),
    ],
}
