"""What the store did, as plain frozen records the UI can show.

Owns: the event types and their one-line summaries. Store operations return
these instead of logging, so the caller (controller, CLI, cache browser)
decides where they appear. Numbers are raw (tokens, bytes, milliseconds);
formatting them is the caller's business, except for `summary()` (sizes via
`ds4tui.format.display.human_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ds4tui.format.display import human_bytes


@dataclass(frozen=True)
class Saved:
    """A checkpoint reached disk (or an identical one was already there: `reused`)."""

    sha: str
    path: str
    reason: str
    tokens: int
    bytes: int
    ms: float
    created_at: int
    reused: bool = False

    def summary(self) -> str:
        how = "kept existing" if self.reused else "saved"
        return f"kv {how} {self.sha[:12]} {self.reason} tokens={self.tokens} size={human_bytes(self.bytes)} in {self.ms:.1f} ms"


@dataclass(frozen=True)
class SaveFailed:
    """A save that did not happen; the directory is as it was before it."""

    reason: str
    tokens: int
    bytes: int

    def summary(self) -> str:
        return f"kv save skipped (tokens={self.tokens}): {self.reason}"


@dataclass(frozen=True)
class Hit:
    """A checkpoint was restored: prefill only the text after `text_bytes`."""

    sha: str
    path: str
    reason: str
    tokens: int
    text_bytes: int
    bytes: int
    hits: int
    ms: float
    title: str | None = None

    def summary(self) -> str:
        return f"kv hit {self.sha[:12]} tokens={self.tokens} size={human_bytes(self.bytes)} load={self.ms:.1f} ms hits={self.hits}"


@dataclass(frozen=True)
class Miss:
    """No usable checkpoint: the prompt is prefilled cold."""

    reason: str

    def summary(self) -> str:
        return f"kv miss: {self.reason}"


@dataclass(frozen=True)
class Rejected:
    """A candidate file failed validation; `deleted` only when it was proven corrupt."""

    file: str
    reason: str
    deleted: bool = False

    def summary(self) -> str:
        tail = " (deleted)" if self.deleted else ""
        return f"kv rejected {self.file[:12]}: {self.reason}{tail}"


@dataclass(frozen=True)
class EvictedFile:
    """One evicted file. `title`: a titled session's own; `held_by` / `held_by_title`: the
    titled session whose text starts with this file's (the chat it belonged to), so an
    owner can tell its user what went."""

    sha: str
    reason: str
    tokens: int
    hits: int
    bytes: int
    score: float
    titled: bool = False
    title: str | None = None
    held_by: str | None = None
    held_by_title: str | None = None

    def owner(self) -> str | None:
        """The sha of the chat this file belonged to: its own (titled) or its holder's."""
        return self.sha if self.titled else self.held_by


@dataclass(frozen=True)
class Evicted:
    """Files removed (or, with `dry_run`, that would be) to bring the directory under budget."""

    files: tuple[EvictedFile, ...]
    bytes: int
    budget_bytes: int
    dry_run: bool = False

    def summary(self) -> str:
        verb = "would evict" if self.dry_run else "evicted"
        return f"kv {verb} {len(self.files)} file(s), {human_bytes(self.bytes)} (budget {human_bytes(self.budget_bytes)})"


Event = Saved | SaveFailed | Hit | Miss | Rejected | Evicted
