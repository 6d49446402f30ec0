"""The chats that predate the conversation store, brought into it: titled `.kv` sessions and
remote JSON transcripts.

Owns `import_existing`: every titled session of a cache directory (its title, times, the
model that wrote it where the directory noted it, and the messages read back from its
stored text by the one transcript parser) and every remote transcript of a transcripts
directory becomes one stored chat. Each source is imported once: `kv:<sha>` or
`json:<name>` is recorded with the chat in the same transaction, and a titled file that a
stored chat already points at (its `kv_sha`: a chat of this ds4tui) is that chat's cache,
not a new chat. So it can run at every start: the second run reads only headers.

Files are untrusted input: one that cannot be read or parsed is skipped, with why, in
the report; nothing here raises for a file. Torch-free: it runs before the model loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ds4tui.cache.entry import inspect_file
from ds4tui.cache.files import read_text
from ds4tui.cache.safe_open import CacheDirError
from ds4tui.cache.store import KvStore
from ds4tui.chat.model_memo import file_fingerprint, spec_for
from ds4tui.chat.transcript import ROLES, parse_text
from ds4tui.chat.legacy_transcripts import Transcripts
from ds4tui.store import ConversationStore, StoreError


@dataclass
class ImportReport:
    """What one import did: chats imported, sources found imported already, files skipped."""

    imported: int = 0
    already: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why)
    chats: list[str] = field(default_factory=list)  # ids of the chats imported
    error: str | None = None  # the store failed: the import stopped there (the next start retries)

    def summary(self) -> str:
        """One line for a notice: "imported 3 chats (1 file skipped: ...)"."""
        parts = [f"imported {self.imported} chat{'s' if self.imported != 1 else ''}"]
        if self.skipped:
            name, why = self.skipped[0]
            more = f" and {len(self.skipped) - 1} more" if len(self.skipped) > 1 else ""
            parts.append(f"skipped {Path(name).name}: {why}{more}")
        if self.error:
            parts.append(f"stopped: {self.error}")
        return "; ".join(parts)


def import_existing(store: ConversationStore, cache_dir: str | os.PathLike | None,
                    transcripts_dir: str | os.PathLike | None) -> ImportReport:
    """Import every titled `.kv` session of `cache_dir` and every transcript of
    `transcripts_dir` not imported yet (either may be None: nothing from there)."""
    report = ImportReport()
    try:
        if cache_dir is not None:
            _import_kv(store, Path(cache_dir), report)
        if transcripts_dir is not None:
            _import_transcripts(store, Path(transcripts_dir), report)
    except StoreError as exc:
        report.error = str(exc)
    return report


# -- titled .kv sessions ------------------------------------------------------------------


def _import_kv(store: ConversationStore, cache_dir: Path, report: ImportReport) -> None:
    kv = KvStore(cache_dir)
    try:
        shas = kv.shas()
    except CacheDirError as exc:
        report.skipped.append((str(cache_dir), str(exc)))
        return
    for sha in shas:
        path = kv.path_for(sha)
        head = inspect_file(path, acceptor=None, deep=False)  # 52 bytes: is it a titled session?
        if head.header is None:
            if head.error != "file not found":  # gone since the listing: nothing to say
                report.skipped.append((str(path), head.error or "not a KVC file"))
            continue
        if not head.header.titled:
            continue  # an untitled checkpoint: a prompt prefix, not a chat
        if store.imported(f"kv:{sha}") or store.by_kv_sha(sha) is not None:
            report.already += 1
            continue
        try:
            chat = _kv_chat(cache_dir, path)
        except _Skip as why:
            report.skipped.append((str(path), str(why)))
            continue
        report.chats.append(store.create(source=f"kv:{sha}", engine="local", kv_sha=sha, **chat))
        report.imported += 1


class _Skip(Exception):
    """Why one file is not imported (one line)."""


def _kv_chat(cache_dir: Path, path: Path) -> dict:
    """The fields of the chat a titled file holds; _Skip when it cannot be read back."""
    e = inspect_file(path, acceptor=None, deep=True, preview_bytes=0)
    h = e.header
    if not e.valid or h is None:
        raise _Skip(e.error or "not a KVC file")
    if not e.title or not e.title.strip():
        raise _Skip("its title trailer is missing or empty")
    raw = read_text(path, h.text_bytes)
    if raw is None:
        raise _Skip("its stored text could not be read")
    messages = _messages(raw.decode("utf-8", errors="replace"))
    return {"title": e.title, "model": spec_for(cache_dir, file_fingerprint(path)) or "",
            "system_prompt": _system_prompt(messages), "created_at": float(h.created_at or 0) or None,
            "updated_at": float(h.last_used or h.created_at or 0) or None, "kv_tokens": h.tokens,
            "messages": messages}


def _messages(text: str) -> list[dict]:
    try:
        messages = parse_text(text)
    except ValueError as exc:
        raise _Skip(str(exc)) from None
    return _checked(messages)


def _checked(messages: list[dict]) -> list[dict]:
    odd = next((m["role"] for m in messages if m.get("role") not in ROLES), None)
    if odd is not None:
        raise _Skip(f"a message has the role {str(odd)[:20]!r}; a chat holds {', '.join(ROLES)}")
    if not any(m["role"] == "user" for m in messages):
        raise _Skip("it holds no user message")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _system_prompt(messages: list[dict]) -> str | None:
    return messages[0]["content"] if messages and messages[0]["role"] == "system" else None


# -- remote JSON transcripts -----------------------------------------------------------------


def _import_transcripts(store: ConversationStore, directory: Path, report: ImportReport) -> None:
    transcripts = Transcripts(directory)
    try:
        names = sorted(p.stem for p in directory.iterdir() if p.suffix == ".json")
    except FileNotFoundError:
        return
    except OSError as exc:
        report.skipped.append((str(directory), exc.strerror or str(exc)))
        return
    for name in names:
        try:
            path = transcripts.path_for(name)
        except LookupError:
            continue  # not a name the chat made (`<32 hex>.json`): someone else's file
        if store.imported(f"json:{name}"):
            report.already += 1
            continue
        try:
            t = transcripts.load(name)
            mtime = path.stat().st_mtime
            messages = _checked(t.messages)
        except (LookupError, OSError) as exc:
            report.skipped.append((str(path), str(exc)))
            continue
        except _Skip as why:
            report.skipped.append((str(path), str(why)))
            continue
        report.chats.append(store.create(
            source=f"json:{name}", title=t.title, model=t.model, engine=t.engine or "remote",
            system_prompt=_system_prompt(messages), created_at=float(t.created_at) or mtime,
            updated_at=mtime, messages=messages))
        report.imported += 1
