"""The JSON transcripts of remote conversations that earlier versions kept (before the
conversation store); read now only by the import (chat/history_import.py), and written
by its tests. Not to be confused with chat/transcript.py (a stored text's messages, export).

Owns: one JSON file per conversation (`<32 hex>.json` in one directory), written
atomically; listing them newest first as `SavedSession`s so the
sidebar and `--resume` treat them like titled sessions; finding by name prefix
or title; reading one back with every field checked (the files are input, not
trusted: size capped, types checked, unknown roles dropped).
File names are made here (random hex), never taken from a request or a title.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ds4tui.chat.checkpoints import SavedSession

FORMAT = "ds4tui-transcript-1"
MAX_FILE_BYTES = 32 << 20
_NAME = re.compile(r"^[0-9a-f]{32}$")
_ROLES = {"system", "user", "assistant"}


@dataclass(frozen=True)
class Transcript:
    sha: str
    title: str
    created_at: int
    messages: list[dict]
    engine: str = ""
    model: str = ""


class Transcripts:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def new_name(self) -> str:
        return uuid.uuid4().hex

    def path_for(self, sha: str) -> Path:
        if not _NAME.match(sha):
            raise LookupError(f"{sha[:40]!r} is not a transcript name")
        return self.directory / f"{sha}.json"

    def save(self, t: Transcript) -> None:
        """Write atomically (temp file + rename); OSError is the caller's to report."""
        self.directory.mkdir(parents=True, exist_ok=True)
        body = {"format": FORMAT, "title": t.title, "created_at": t.created_at, "last_used": int(time.time()),
                "engine": t.engine, "model": t.model, "messages": t.messages}
        path = self.path_for(t.sha)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(body, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)

    def load(self, sha: str) -> Transcript:
        """One transcript; LookupError when missing or not a valid transcript."""
        path = self.path_for(sha)
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise LookupError(f"{sha[:12]}: larger than {MAX_FILE_BYTES >> 20} MiB")
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise LookupError(f"no transcript {sha[:12]}") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise LookupError(f"{sha[:12]}: unreadable transcript ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("messages"), list):
            raise LookupError(f"{sha[:12]}: not a ds4tui transcript")
        messages = [{"role": m["role"], "content": m["content"]} for m in data["messages"]
                    if isinstance(m, dict) and m.get("role") in _ROLES and isinstance(m.get("content"), str)]
        title = data.get("title") if isinstance(data.get("title"), str) else "untitled"
        created = data.get("created_at") if isinstance(data.get("created_at"), int) else 0
        return Transcript(sha=sha, title=title, created_at=created, messages=messages,
                          engine=str(data.get("engine", "")), model=str(data.get("model", "")))

    def delete(self, sha: str) -> None:
        try:
            self.path_for(sha).unlink()
        except FileNotFoundError:
            pass

    def listing(self) -> list[SavedSession]:
        """Every readable transcript, most recently used first."""
        out = []
        try:
            paths = [p for p in self.directory.iterdir() if p.suffix == ".json" and _NAME.match(p.stem)]
        except OSError:
            return []
        for path in paths:
            try:
                t = self.load(path.stem)
                st = path.stat()
            except (LookupError, OSError):
                continue
            out.append(SavedSession(sha=t.sha, path=str(path), title=t.title, created_at=t.created_at,
                                    last_used=int(st.st_mtime), tokens=0, file_bytes=st.st_size))
        out.sort(key=lambda s: (s.last_used, s.created_at), reverse=True)
        return out

    def find(self, query: str) -> list[SavedSession]:
        """Transcripts whose name starts with `query` (hex), else whose title equals it (any case)."""
        sessions = self.listing()
        q = query.strip()
        if q and all(c in "0123456789abcdef" for c in q.lower()):
            by_name = [s for s in sessions if s.sha.startswith(q.lower())]
            if by_name:
                return by_name
        exact = [s for s in sessions if s.title == q]
        return exact or [s for s in sessions if (s.title or "").casefold() == q.casefold()]
