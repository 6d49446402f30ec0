"""How the cache browser writes numbers, times and file text for people.

Owns: durations, the resume-cost estimate, and file text as rich `Text`
(the escaping rule, byte sizes and times are `ds4tui.format.display`'s).
Leaves to callers: which fields to show and where. Pure functions, no Textual,
so the formats are unit-testable.

The defaults in `ResumeCost` (a cold disk read, the default model's fp32
prefill) and where they were measured: docs/perf-archive.md, "Resume-cost defaults of
the cache browser". The app passes figures it measured when it has them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from ds4tui.format.display import safe_lines, safe_text

DEFAULT_DISK_MB_S = 450.0
DEFAULT_PREFILL_TOK_S = 288.0
MB = 1_000_000  # disk throughput is quoted in decimal megabytes


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


@dataclass(frozen=True)
class ResumeCost:
    """What resuming a file costs and saves: load its bytes vs prefill its tokens cold."""

    load_bytes: int
    load_s: float
    tokens: int
    prefill_s: float
    disk_mb_s: float
    prefill_tok_s: float

    @classmethod
    def estimate(cls, load_bytes: int, tokens: int, *, disk_mb_s: float = DEFAULT_DISK_MB_S,
                 prefill_tok_s: float = DEFAULT_PREFILL_TOK_S) -> ResumeCost:
        return cls(
            load_bytes=load_bytes,
            load_s=load_bytes / (disk_mb_s * MB) if disk_mb_s > 0 else float("inf"),
            tokens=tokens,
            prefill_s=tokens / prefill_tok_s if prefill_tok_s > 0 else float("inf"),
            disk_mb_s=disk_mb_s,
            prefill_tok_s=prefill_tok_s,
        )

    @property
    def saved_s(self) -> float:
        return self.prefill_s - self.load_s


# ds4's save reasons as a user reads them. ds4 names a chat's own checkpoint `agent-session`
# (and an agent's system prefix `agent-system`): the browser says "chat" and keeps the code
# in the detail pane, where `reason  chat (agent-session, 6)` ties the two together.
REASON_LABELS = {"agent-session": "chat", "agent-system": "system prefix"}


def reason_label(reason: str) -> str:
    """The word the browser shows for a header's reason name."""
    return REASON_LABELS.get(reason, reason)


def file_text(text: str | bytes | None, style: str = "") -> Text:
    """Multi-line text from a file as a rich `Text` (never parsed as markup), made
    terminal-safe by `display.safe_lines`: newline and tab kept, every other control escaped."""
    return Text(safe_lines(text), style=style)


def safe_cell(text: str | bytes | None, limit: int = 60, style: str = "") -> Text:
    """A single-line cell (titles, errors, first text line): `display.safe_text`, cut with … past `limit`."""
    return Text(safe_text(text, limit), style=style, no_wrap=True, overflow="ellipsis")
