"""The cache browser's detail of one file: what the pane shows for the file under the cursor.

Owns: `resume_block` (why a file cannot be resumed here) and `detail_info` (everything
the pane shows, `KvDetailInfo`: raw header, fingerprint, resume cost, the saves of
the same chat for the timeline), read from the listing's last scan.
Leaves the drawing to `widgets.kv_detail.KvDetail`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds4tui.cache.entry import KvEntry
from ds4tui.screens.cache_listing import CacheListing
from ds4tui.screens.widgets.kv_detail import KvDetailInfo
from ds4tui.screens.widgets.kv_format import ResumeCost


def resume_block(e: KvEntry) -> str | None:
    """Why `e` cannot be resumed with this model (shown, and the text opened read-only), or None."""
    if e.corrupt:
        return f"corrupt: {e.error}"
    return e.error


@dataclass(frozen=True)
class DetailContext:
    """What the detail needs beside the file: the running model's identity and the speeds
    that price a resume."""

    model_fingerprint: bytes | None
    disk_mb_s: float
    prefill_tok_s: float


def detail_info(e: KvEntry, listing: CacheListing, context: DetailContext, now: float) -> KvDetailInfo:
    scan = listing.scan
    cost = None
    if e.header is not None:
        cost = ResumeCost.estimate(e.file_bytes, e.header.tokens, disk_mb_s=context.disk_mb_s,
                                   prefill_tok_s=context.prefill_tok_s)
    return KvDetailInfo(
        entry=e, raw_header=scan.raw_headers.get(e.path, b"") if scan else b"",
        now=scan.now if scan else now, cost=cost,
        fingerprint=scan.fingerprints.get(e.path) if scan else None,
        model_fingerprint=context.model_fingerprint,
        resume_block=resume_block(e),
        name=listing.name_of(e).text, chat_saves=_chat_saves(e, listing),
    )


def _chat_saves(e: KvEntry, listing: CacheListing) -> tuple[int, ...]:
    """created_at of every file of e's chat: its titled session and the checkpoints named after it."""
    name = listing.name_of(e)
    chat = e.sha if name.kind == "title" else name.chat_sha
    if chat is None or listing.scan is None:
        return (e.header.created_at,) if e.header else ()
    return tuple(sorted(f.header.created_at for f in listing.scan.entries if f.header is not None and (
        f.sha == chat or listing.name_of(f).chat_sha == chat)))
