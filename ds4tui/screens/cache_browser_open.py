"""Opening a file from the cache browser: resume it in the chat, or read its transcript.

Owns: `FileOpening`, what Enter does to the file under the listing's cursor (a
checkpoint of a titled chat offers that chat instead; a file this model cannot load is
explained and shown read-only) and `v` (the whole transcript, read in an `io` worker,
at most `TRANSCRIPT_CAP` bytes).
Leaves to the screen what resuming means (the `resume` callback: it posts the screen's
`ResumeRequested`).
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text

from ds4tui.cache import scan as cache_scan
from ds4tui.cache.entry import KvEntry
from ds4tui.screens.cache_browser_detail import resume_block
from ds4tui.screens.cache_listing import CacheListing
from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog
from ds4tui.screens.widgets.kv_format import safe_cell
from ds4tui.screens.widgets.transcript_view import TranscriptView

# The transcript modal reads at most this much text.
TRANSCRIPT_CAP = 16 << 20


class FileOpening:
    """Resume and view, on the file under `listing`'s cursor."""

    def __init__(self, listing: CacheListing, resume: Callable[[KvEntry], None]) -> None:
        self.listing = listing
        self._resume = resume

    def resume(self) -> None:
        e = self.listing.selected
        if e is None:
            return
        block = resume_block(e)
        name = self.listing.name_of(e)
        owner = self.listing.by_sha.get(name.chat_sha) if name.chat_sha else None
        if block is None and owner is not None and resume_block(owner) is None:
            # A checkpoint of a titled chat: opening it would make a second copy of that chat.
            question = Text("This checkpoint belongs to the chat ")
            question.append_text(safe_cell(name.chat_title, 60, "bold"))
            question.append(". Open that chat?")

            def answered(yes: bool | None) -> None:
                if yes:
                    self._resume(owner)

            self.listing.app.push_screen(ConfirmDialog(question, yes_label="Open the chat", danger=False), answered)
            return
        if block is None:
            self._resume(e)
            return
        self.listing.notify(block[:1].upper() + block[1:], title="Cannot resume here", severity="warning",
                            markup=False)
        self._show_text(e, f"cannot resume: {block}")

    def view_text(self) -> None:
        e = self.listing.selected
        if e is not None:
            self._show_text(e, "")

    def _show_text(self, e: KvEntry, note: str) -> None:
        title = self.listing.name_of(e).text
        app = self.listing.app

        def read() -> None:
            try:
                text = cache_scan.read_transcript(e, TRANSCRIPT_CAP)
            except (OSError, ValueError) as exc:
                app.call_from_thread(app.notify, f"No text to show: {exc}", severity="error", markup=False)
                return
            app.call_from_thread(app.push_screen, TranscriptView(title, text, note=note))

        self.listing.run_worker(read, thread=True, group="io", description="read a transcript")
