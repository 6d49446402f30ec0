"""What a file is called: a title for every row, untitled checkpoints included.

One rule for the cache browser's table and `ds4tui kv ls`'s TITLE column.
Owns the naming rule (docs/cache-browser.md, "Names"): a titled session is its
title; an untitled checkpoint is named after the chat it belongs to (`↳ title`,
from `cache.scan.chat_of`), else as the shared start of several chats, else by
its first user message (the template parsed back), else its first line. Pure
functions, no Textual; the browser's scan worker calls `name_files` off the UI thread,
`kv ls` calls `name_entries`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ds4tui.cache.entry import KvEntry
from ds4tui.cache.scan import BrowserScan, ChatOf, TextIndex, chat_of
from ds4tui.engine.text.transcripts import parse_transcript
from ds4tui.format.display import one_line

BELONGS = "↳ "  # before the title of the chat an untitled checkpoint belongs to


@dataclass(frozen=True)
class FileName:
    text: str  # one line, terminal-safe
    kind: str  # "title" | "chat" (of a titled session) | "shared" | "message" | "text"
    chat_sha: str | None = None  # kind "chat": the titled session it belongs to
    chat_title: str | None = None


def name_of(e: KvEntry, chats: Mapping[str, ChatOf] | None, text: str | None) -> FileName:
    """`chats`: untitled file path -> the chat it belongs to (`cache.scan.chat_of`);
    `text`: the file's text (else its preview is parsed)."""
    if e.title is not None:
        return FileName(one_line(e.title), "title")
    chat = chats.get(e.path) if chats is not None else None
    if chat is not None and chat.sha is not None:
        return FileName(BELONGS + one_line(chat.title), "chat", chat.sha, chat.title)
    body = text if text is not None else e.text_preview
    messages = [m for m in parse_transcript(body or "") or [] if str(m.get("content", "")).strip()]
    first = next((m["content"] for m in messages if m.get("role") == "user"), None)
    if chat is not None and chat.shared:
        what = one_line(first) if first else "system prompt"
        return FileName(f"start of {chat.shared} chats: {what}", "shared")
    if first:
        return FileName(one_line(first), "message")
    if messages:  # no user turn yet: a system prompt checkpoint, say, named by its role
        return FileName(f"{one_line(messages[0].get('role'))}: {one_line(messages[0]['content'])}", "message")
    line = next((ln for ln in (body or "").splitlines() if ln.strip()), "")
    if not line and e.header is None:  # not a KVC file at all (its status says why): never a blank row
        return FileName(f"unreadable file {(e.sha or '?')[:12]}", "text")
    return FileName(one_line(line), "text")


def _needs_text(e: KvEntry, chats: Mapping[str, ChatOf]) -> bool:
    """Whether `name_of` reads the file's text: not for a title or a chat's checkpoint."""
    chat = chats.get(e.path)
    return e.title is None and not (chat is not None and chat.sha is not None)


def name_files(scan: BrowserScan, texts: TextIndex) -> dict[str, FileName]:
    """path -> its name, for every file of `scan` (a text is decoded only where the name needs it)."""
    return {e.path: name_of(e, scan.chats, texts.text(e.path) if _needs_text(e, scan.chats) else None)
            for e in scan.entries}


def name_entries(entries: list[KvEntry], texts_of: Callable[[list[str]], Mapping[str, bytes]] | None = None,
                 chats: Mapping[str, tuple] | None = None) -> dict[str, FileName]:
    """path -> its name, for entries read without a browser scan. `chats`: path -> (sha, title,
    shared) (`KvStore.chats_of`, from the header index), else worked out from the texts;
    `texts_of(paths)`: the texts known for those paths (`KvStore.indexed_texts`); the others
    are read from their files, once each."""
    texts = TextIndex()
    if chats is not None:
        owners = {path: ChatOf(*c) for path, c in chats.items()}
        need = [e for e in entries if _needs_text(e, owners)]
    else:
        need = entries
    known = texts_of([e.path for e in need]) if texts_of is not None else {}
    for e in need:
        texts.refresh(e, known.get(e.path))
    if chats is None:
        owners = chat_of(entries, texts)
    return {e.path: name_of(e, owners, texts.text(e.path) if _needs_text(e, owners) else None) for e in entries}
