"""Find a chat: every `.kv` file of a cache directory, its title and its transcript decoded
from the stored text, searched for a pattern. Torch-free (`ds4tui kv grep` loads no model).

Owns the matching (case-insensitive text, or a regular expression) and what one match
says: the file, its title, the message and the line that matched. Which files a model
can resume, and at what cost, is the controller's business (ChatController.search).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ds4tui.cache.entry import inspect_file
from ds4tui.cache.files import read_text
from ds4tui.cache.store import KvStore
from ds4tui.chat.transcript import parse_text

LINE_CHARS = 200  # a matching line is shown clipped to this


@dataclass(frozen=True)
class SearchHit:
    sha: str
    path: str
    title: str | None  # None: an untitled checkpoint
    role: str  # "title", a message role, or "text" when the transcript did not parse
    message: int  # index into the parsed messages; -1 for a title match
    line: str  # the matching line (clipped to LINE_CHARS)
    tokens: int
    file_bytes: int
    model_id: int
    created_at: int
    last_used: int


def matcher(pattern: str, regex: bool = False):
    """A predicate on one line: case-insensitive substring, or a regular expression (re.I)."""
    if regex:
        rx = re.compile(pattern, re.IGNORECASE)
        return lambda line: rx.search(line) is not None
    needle = pattern.casefold()
    return lambda line: needle in line.casefold()


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…"


def search(directory: str | Path, pattern: str, *, regex: bool = False, per_file: int = 3) -> list[SearchHit]:
    """Matches in every valid file, newest first (last use); at most `per_file` lines a file."""
    match = matcher(pattern, regex)
    store = KvStore(directory)
    hits: list[SearchHit] = []
    for sha in store.shas():
        path = store.path_for(sha)
        e = inspect_file(path, deep=True, preview_bytes=0)
        h = e.header
        if not e.valid or h is None:
            continue
        title = e.title if h.titled else None

        def hit(role: str, index: int, line: str) -> SearchHit:
            return SearchHit(sha=sha, path=str(path), title=title, role=role, message=index, line=_clip(line),
                             tokens=h.tokens, file_bytes=e.file_bytes, model_id=h.model_id,
                             created_at=h.created_at, last_used=h.last_used)

        found: list[SearchHit] = []
        if title and match(title):
            found.append(hit("title", -1, title))
        raw = read_text(path, h.text_bytes)
        text = raw.decode("utf-8", errors="replace") if raw is not None else ""
        try:
            parts = [(m["role"], i, m["content"]) for i, m in enumerate(parse_text(text))]
        except ValueError:
            parts = [("text", 0, text)]
        for role, index, content in parts:
            for line in content.splitlines():
                if len(found) >= per_file:
                    break
                if match(line):
                    found.append(hit(role, index, line))
        hits += found
    hits.sort(key=lambda x: (x.last_used, x.created_at), reverse=True)
    return hits
