"""What the chat shows for a cache or error event: a status-bar line and maybe a toast.

Owns the wording and the severity, as plain data (`Notice`), so the screen
only routes them and the mapping is testable without a terminal. Numbers go
through `widgets.fmt`, sizes through `format.display.human_bytes`; file-derived text (reasons, titles) stays plain text:
the screen shows it with markup off.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch

from ds4tui.chat import events as ev
from ds4tui.format.display import human_bytes
from ds4tui.screens.widgets import fmt


@dataclass(frozen=True)
class Notice:
    status: str | None = None  # the status bar's cache slot; None leaves it as it was
    toast: str | None = None
    title: str = ""
    severity: str = "information"  # information | warning | error


@singledispatch
def notice_for(event: object) -> Notice:
    """The notice for one cache/error event: an empty Notice for events that show nothing.

    One registered function per event type; a new event that needs a notice is one more."""
    return Notice()


@notice_for.register
def _hit(event: ev.Hit) -> Notice:
    return Notice(f"kv hit {fmt.tokens(event.tokens)} tok in {fmt.ms(event.ms)}",
                  f"Restored {fmt.tokens(event.tokens)} tokens from disk ({human_bytes(event.bytes)},"
                  f" {fmt.ms(event.ms)})", "KV cache hit")


@notice_for.register
def _miss(event: ev.Miss) -> Notice:
    return Notice(f"kv miss: {event.reason}")


@notice_for.register
def _saved(event: ev.Saved) -> Notice:
    if event.reason == "agent-session":
        # Every turn re-saves the chat; a toast each time would be noise.
        return Notice(f"session saved ({fmt.tokens(event.tokens)} tok)")
    verb = "kept" if event.reused else "saved"
    return Notice(f"kv {verb} {event.reason} {fmt.tokens(event.tokens)} tok",
                  f"Checkpoint ({event.reason}): {fmt.tokens(event.tokens)} tokens, {human_bytes(event.bytes)}"
                  + (" (already on disk)" if event.reused else f" in {fmt.ms(event.ms)}"), "KV cache saved")


@notice_for.register
def _save_failed(event: ev.SaveFailed) -> Notice:
    return Notice("kv save failed", f"Checkpoint not saved: {event.reason}", "KV cache", "error")


@notice_for.register
def _evicted(event: ev.Evicted) -> Notice:
    if not event.files:
        return Notice()
    return Notice(f"kv evicted {len(event.files)} file(s)",
                  f"Evicted {len(event.files)} file(s), {human_bytes(event.bytes)}, to stay under the"
                  f" {human_bytes(event.budget_bytes)} budget", "KV cache", "warning")


@notice_for.register
def _rejected(event: ev.Rejected) -> Notice:
    return Notice(f"kv rejected {event.file[:12]}", f"Ignored cache file {event.file[:12]}: {event.reason}",
                  "KV cache", "warning")


@notice_for.register
def _chat_error(event: ev.ChatError) -> Notice:
    return Notice(None, event.message, f"Error: {event.where}", "error")


def brief_reason(reason: str | None) -> str | None:
    """A reason cut to its first two parts for the stats line, e.g. "file rejected: checksum
    mismatch" (the toast and the cache browser give the whole of it, hashes and offsets)."""
    if not reason:
        return reason
    return ": ".join(reason.split(": ")[:2]).split(",")[0]


def cache_line(report: ev.CacheReport) -> str:
    """Where a turn's prefix came from and what it computed, e.g.
    "reused 3,412 tok (live) · prefilled 57" or "reused 2,048 (disk 5f71a3…, 31 ms) · prefilled 1,380"."""
    if report.source == "cold":
        head = f"cold: {brief_reason(report.reason) or 'no cached prefix'}"
    elif report.source == "disk":
        where = f"disk {report.sha[:6]}…" if report.sha else "disk"
        if report.ms is not None:
            where += f", {fmt.ms(report.ms)}"
        head = f"reused {fmt.tokens(report.reused)} tok ({where})"
    else:
        head = f"reused {fmt.tokens(report.reused)} tok ({report.source})"
        if report.replayed:
            head += f", rewound re-running {fmt.tokens(report.replayed)}"
    return f"{head} · prefilled {fmt.tokens(report.prefilled)}"


def _decode_mode(done: ev.Done) -> str:
    """` greedy`, or ` sampled (sampler 2%)`: the share of the decode time spent choosing
    tokens, so a slow reply is never blamed on the sampler unseen."""
    if done.sampled is None:
        return ""
    if not done.sampled:
        return " greedy"
    decode_ms = done.tokens / done.tok_s * 1000.0 if done.tok_s > 0 else 0.0
    if decode_ms <= 0:
        return " sampled"
    return f" sampled (sampler {fmt.share(done.sampler_ms / decode_ms)})"


def stats_line(done: ev.Done) -> str:
    """The dim line under a finished reply: what the cache gave, then the reply's length and
    decode speed, then the time to its first token."""
    parts = []
    if done.cache is not None:
        parts.append(cache_line(done.cache))
    elif done.prompt_tokens:
        parts.append(f"prefill {fmt.tokens(done.prompt_tokens)} tok")
    if done.cached_tokens:
        parts.append(f"cached {fmt.tokens(done.cached_tokens)} tok")
    # "reply N tokens at R": a bare rate after "prefilled N" read as the prefill's speed.
    parts += [f"reply {fmt.tokens(done.tokens)} tokens at {fmt.rate(done.tok_s)}{_decode_mode(done)}",
              f"first token {fmt.ms(done.ttft_ms)}"]
    if done.regenerated:
        parts.append("regenerated" + ("" if done.forward_before_first_token else " from kept logits"))
    stopped = stop_note(done.stop)
    if stopped:
        parts.append(stopped)
    return " · ".join(parts)


def stop_note(stop: str) -> str | None:
    """How a reply that did not end on its own is marked under it (live, or resumed); None when it did."""
    if stop == "context-full":
        return "■ context full"
    if stop in ("eos", "stop-string"):
        return None
    return f"stopped: {stop}"
