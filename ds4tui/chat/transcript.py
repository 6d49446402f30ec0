"""Transcripts in and out: a stored text parsed back into messages, Markdown and JSON
export (OpenAI messages shape), and the JSON a chat is imported from.

Torch-free on purpose (`ds4tui kv export`, `kv grep` and `ds4tui chats` run without
loading a model). A stored text is read by the one transcript parser
(engine/text/transcripts.py: ChatML, DeepSeek V4, Gemma and Llama 3, known by their
first markers); a text in any other template needs the model's own (`--model`), which
the caller loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from ds4tui.chat.next_turn import without_open_turn
from ds4tui.engine.text.transcripts import parse_transcript
from ds4tui.format.display import local_time

ROLES = ("system", "user", "assistant")

UNKNOWN_TEMPLATE = "the text is not in a chat template ds4tui knows without its model (ChatML, DeepSeek V4, Gemma, Llama 3)"


def parse_text(text: str, template=None) -> list[dict]:
    """Messages of a stored transcript, the opened next turn left out (chat/next_turn.py).
    `template` (a loaded model's own) reads it instead when given: it knows what that template
    writes by itself. ValueError when nothing reads it."""
    messages = template.parse(text) if template is not None else parse_transcript(text)
    if messages is None:
        raise ValueError(UNKNOWN_TEMPLATE)
    return without_open_turn([{"role": m["role"], "content": m["content"]} for m in messages])


def to_markdown(messages: Sequence[dict], title: str | None, created_at: int | None = None,
                last_used: int | None = None) -> str:
    lines = [f"# {title or 'Untitled chat'}", ""]
    lines.append(f"_created {local_time(created_at)} · last used {local_time(last_used)}_")
    for m in messages:
        lines += ["", f"## {m['role']}", "", m["content"]]
    return "\n".join(lines) + "\n"


def to_json(messages: Sequence[dict], title: str | None, created_at: int | None = None,
            last_used: int | None = None, sha: str | None = None) -> dict:
    """{"title", "created_at", "last_used", "sha", "messages": [{"role", "content"}]}: the
    messages are what the OpenAI chat API takes."""
    return {"title": title, "created_at": created_at, "last_used": last_used, "sha": sha,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages]}


def from_json(data: Any) -> tuple[list[dict], str | None, int | None]:
    """(messages, title, created_at) of an exported chat, or of a bare OpenAI messages list.
    ValueError naming what is wrong; roles other than system/user/assistant are refused."""
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError("expected an object with a \"messages\" list, or a list of messages")
    out = []
    for i, m in enumerate(data["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"message {i}: role must be one of {', '.join(ROLES)}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise ValueError(f"message {i}: content must be text")
        out.append({"role": m["role"], "content": content})
    title = data.get("title")
    created = data.get("created_at")
    return out, title if isinstance(title, str) and title.strip() else None, created if isinstance(created, int) else None


def load_json_file(path) -> tuple[list[dict], str | None, int | None]:
    with open(path, encoding="utf-8") as fp:
        try:
            data = json.load(fp)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
    return from_json(data)


def export_name(title: str | None) -> str:
    """A file name from a title: letters, digits, dashes (at most 60)."""
    name = "".join(c if c.isalnum() else "-" for c in title or "").strip("-")
    return (name or "chat")[:60]


def write_export(directory: str | os.PathLike, messages: Sequence[dict], title: str | None,
                 created_at: int | None, last_used: int | None, sha: str | None = None) -> tuple[Path, Path]:
    """Write NAME.md and NAME.json into `directory` (made if missing); NAME-2, NAME-3... when a
    file of that name is there already, so an export never replaces an earlier one (two chats
    both called "New chat"). Returns the two paths; OSError when the directory cannot be written."""
    folder = Path(directory).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    stem = export_name(title)
    n = 1
    while True:
        base = folder / (stem if n == 1 else f"{stem}-{n}")
        md, js = base.with_name(base.name + ".md"), base.with_name(base.name + ".json")
        if not md.exists() and not js.exists():
            break
        n += 1
    # "x": a file made meanwhile by another process is refused, not overwritten.
    with open(md, "x", encoding="utf-8") as fp:
        fp.write(to_markdown(messages, title, created_at, last_used))
    with open(js, "x", encoding="utf-8") as fp:
        fp.write(json.dumps(to_json(messages, title, created_at, last_used, sha=sha), indent=2) + "\n")
    return md, js
