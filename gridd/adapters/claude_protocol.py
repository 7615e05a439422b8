"""Claude Code's stream-json shapes that gridd writes, and the Asks it builds from what it
reads. Pure functions; ``claude.py`` keeps the per-run state.

Lines gridd writes to Claude's stdin (each one JSON object and a newline):

    prompt / plain answer   {"type":"user","message":{"role":"user","content":TEXT}}
    AskUserQuestion answer  {"type":"user","message":{"role":"user","content":[
                              {"type":"tool_result","tool_use_id":ID,"content":TEXT}]}}
    control answer          {"type":"control_response","response":{"subtype":"success",
                              "request_id":ID,"response":DECISION}}
    DECISION                {"behavior":"allow","updatedInput":<the request's input>}
                            a suggestion chosen: the same, plus "updatedPermissions":
                              [<that entry of the request's permission_suggestions>]
                            {"behavior":"deny","message":"denied by user"}
                            AskUserQuestion: {"behavior":"allow","updatedInput":
                              {...input, "answers":{QUESTION: LABEL}}}

Sources: claude-agent-sdk-python ``_internal/query.py`` (``_handle_control_request``: the
success envelope, ``updatedInput`` defaulting to the original input, ``deny`` + ``message``),
vibe-kanban ``executors/claude/types.rs`` (``PermissionResult`` tagged by ``behavior``,
``ControlResponseType::Success {request_id, response}``, ``Message::new_user``), and the
Agent SDK guide "Handle approvals and user input" (AskUserQuestion input ``{"questions":
[{"question","header","options":[{"label","description"}],"multiSelect"}]}``, answered with
``answers`` keyed by question text, several labels joined with ", ").
"""

from __future__ import annotations

import json
from typing import Any

from gridd.adapters.base import Ask
from gridd.errors import ValidationFailed

ASK_TOOL = "AskUserQuestion"
DENY_MESSAGE = "denied by user"
ALLOW_WORDS = frozenset({"allow", "yes", "y", "approve", "approved", "ok"})
DENY_WORDS = frozenset({"deny", "no", "n", "reject", "denied"})
SUMMARY_KEYS = ("command", "file_path", "notebook_path", "url", "query", "pattern", "path")
SUMMARY_KEYS_LAST = ("description", "prompt")


def as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def dumps(obj: dict[str, Any]) -> str:
    """One stream-json line: JSON escapes every newline, so the object stays on one line."""
    return json.dumps(obj, separators=(",", ":")) + "\n"


def user_message(content: str | list[dict[str, Any]]) -> str:
    return dumps({"type": "user", "message": {"role": "user", "content": content}})


def tool_result(tool_use_id: str, content: str) -> str:
    block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    return user_message([block])


def control_response(request_id: str, decision: dict[str, Any]) -> str:
    response = {"subtype": "success", "request_id": request_id, "response": decision}
    return dumps({"type": "control_response", "response": response})


def snippet(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def summarize(tool_input: dict[str, Any], limit: int = 120) -> str:
    """A short human summary of a tool's input: its command, path, URL, ... or its JSON."""
    for key in (*SUMMARY_KEYS, *SUMMARY_KEYS_LAST):
        value = tool_input.get(key)
        if isinstance(value, str) and value.strip():
            return snippet(value, limit)
    return snippet(json.dumps(tool_input, ensure_ascii=False), limit) if tool_input else ""


def permission_ask(
    request_id: str,
    tool: str,
    tool_input: dict[str, Any],
    tool_use_id: object,
    suggestions: object = None,
) -> Ask:
    summary = summarize(tool_input)
    meta: dict[str, Any] = {
        "route": "control",
        "request_id": request_id,
        "tool_name": tool,
        "input": tool_input,
    }
    if isinstance(tool_use_id, str):
        meta["tool_use_id"] = tool_use_id
    offered = suggestion_options(suggestions)
    if offered:
        meta["suggestions"] = offered
    question = f"Allow {tool}: {summary}?" if summary else f"Allow {tool}?"
    return Ask(request_id, "permission", question, ["allow", "deny", *offered], meta)


def suggestion_options(suggestions: object) -> dict[str, dict[str, Any]]:
    """The CLI's ``permission_suggestions`` as answer options: a label per suggestion
    ("allow, and accept edits for this session") -> the suggestion, to return as-is in
    ``updatedPermissions`` when chosen."""
    out: dict[str, dict[str, Any]] = {}
    for item in suggestions if isinstance(suggestions, list) else []:
        if not isinstance(item, dict):
            continue
        label = "allow, and " + _suggestion_text(item)
        if label not in out and label not in ("allow", "deny"):
            out[label] = item
    return out


def _suggestion_text(item: dict[str, Any]) -> str:
    where = item.get("destination")
    scope = {
        "session": "for this session",
        "localSettings": "in this project's local settings",
        "projectSettings": "in this project's settings",
        "userSettings": "in the user's settings",
    }.get(str(where), f"({where})" if where else "")
    kind = item.get("type")
    if kind == "setMode":
        return f"switch to {item.get('mode')} mode {scope}".strip()
    if kind in ("addRules", "replaceRules"):
        rules = item.get("rules")
        names = []
        for rule in rules if isinstance(rules, list) else []:
            if isinstance(rule, dict) and isinstance(rule.get("toolName"), str):
                content = rule.get("ruleContent")
                names.append(f"{rule['toolName']}({content})" if content else rule["toolName"])
        behavior = item.get("behavior", "allow")
        return f"always {behavior} {', '.join(names) or 'this'} {scope}".strip()
    if kind == "addDirectories":
        dirs = item.get("directories")
        shown = ", ".join(str(d) for d in dirs) if isinstance(dirs, list) else ""
        return f"allow access to {shown or 'the directory'} {scope}".strip()
    return f"apply {kind} {scope}".strip()


def question_ask(key: str, tool_input: dict[str, Any], route: dict[str, Any]) -> Ask | None:
    """The Ask for an AskUserQuestion input, or None when it holds no question."""
    questions = _questions(tool_input)
    if not questions:
        return None
    meta: dict[str, Any] = {
        **route,
        "questions": [q["question"] for q in questions],
        "multi_select": any(q["multi"] for q in questions),
        "free_text": True,  # Claude's own UI lets the user type an answer of their own
    }
    if len(questions) == 1:
        labels = questions[0]["labels"]
        kind = "decision" if labels else "clarification"
        return Ask(key, kind, questions[0]["question"], list(labels), meta)
    text = "\n".join(
        f"{q['header'] or index}: {q['question']}" for index, q in enumerate(questions, 1)
    )
    return Ask(key, "clarification", text, [], meta)


def encode_answer(meta: dict[str, Any], response: str) -> str:
    route = meta.get("route")
    questions = [q for q in meta.get("questions", []) if isinstance(q, str)]
    if route == "control" and isinstance(meta.get("request_id"), str):
        tool_input = as_dict(meta.get("input"))
        if questions:
            updated = {**tool_input, "answers": answers(questions, response)}
            return control_response(
                meta["request_id"], {"behavior": "allow", "updatedInput": updated}
            )
        suggested = as_dict(meta.get("suggestions")).get(response)
        if isinstance(suggested, dict):
            decision = {
                "behavior": "allow",
                "updatedInput": tool_input,
                "updatedPermissions": [suggested],
            }
            return control_response(meta["request_id"], decision)
        return control_response(meta["request_id"], permission_decision(response, tool_input))
    if route == "tool_result" and isinstance(meta.get("tool_use_id"), str):
        chosen = answers(questions, response)
        content = response if len(chosen) <= 1 else _pairs(chosen)
        return tool_result(meta["tool_use_id"], content)
    if questions:  # Claude dismissed the question: tell it the answer in a new message
        return user_message(
            "\n".join(f'Answer to "{q}": {a}' for q, a in answers(questions, response).items())
        )
    return user_message(response)


def permission_decision(response: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    word = response.strip().lower()
    if word in ALLOW_WORDS:
        return {"behavior": "allow", "updatedInput": tool_input}
    if word in DENY_WORDS:
        return {"behavior": "deny", "message": DENY_MESSAGE}
    raise ValidationFailed(
        f"a permission is answered with 'allow' or 'deny', not {response[:80]!r}",
        details={"options": ["allow", "deny"], "response": response[:200]},
    )


def answers(questions: list[str], response: str) -> dict[str, str]:
    """Question text -> answer. Several questions take a JSON object of answers, or one
    answer for all of them."""
    if len(questions) > 1:
        try:
            given = json.loads(response)
        except ValueError:
            given = None
        if isinstance(given, dict):
            return {q: str(given.get(q, "")) for q in questions}
    return {q: response for q in questions}


def _pairs(chosen: dict[str, str]) -> str:
    return " ".join(f'"{q}"="{a}".' for q, a in chosen.items())


def _questions(tool_input: dict[str, Any]) -> list[dict[str, Any]]:
    raw = tool_input.get("questions")
    out: list[dict[str, Any]] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            continue
        labels: list[str] = []
        options = item.get("options")
        for option in options if isinstance(options, list) else []:
            label = option.get("label") if isinstance(option, dict) else option
            if isinstance(label, str) and label.strip() and label not in labels:
                labels.append(label)
        header = item.get("header")
        out.append(
            {
                "question": item["question"],
                "header": header if isinstance(header, str) else "",
                "labels": labels,
                "multi": item.get("multiSelect") is True,
            }
        )
    return out
