"""Opening a file from the cache browser: resume it in the chat, or read its transcript.

Owns: `FileOpening`, mixed into `CacheBrowserScreen`: Enter (a checkpoint of a
titled chat offers that chat instead; a file this model cannot load is explained
and shown read-only) and `v` (the whole transcript, read in a worker, at most
`TRANSCRIPT_CAP` bytes).
Leaves to the app what resuming means (the screen's `ResumeRequested` message).
"""

from __future__ import annotations

from rich.text import Text
from textual import work

from ds4tui.cache import scan as cache_scan
from ds4tui.cache.entry import KvEntry
from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog
from ds4tui.screens.widgets.kv_format import safe_cell

# The transcript modal reads at most this much text.
TRANSCRIPT_CAP = 16 << 20


class FileOpening:
    """The `CacheBrowserScreen` actions that resume a file or show its text."""

    def action_resume(self) -> None:
        e = self.selected
        if e is None:
            return
        block = self._resume_block(e)
        name = self.name_of(e)
        owner = self._by_sha.get(name.chat_sha) if name.chat_sha else None
        if block is None and owner is not None and self._resume_block(owner) is None:
            # A checkpoint of a titled chat: opening it would make a second copy of that chat.
            question = Text("This checkpoint belongs to the chat ")
            question.append_text(safe_cell(name.chat_title, 60, "bold"))
            question.append(". Open that chat?")

            def answered(yes: bool | None) -> None:
                if yes:
                    self.post_message(self.ResumeRequested(owner.path, owner.sha, owner.title))

            self.app.push_screen(ConfirmDialog(question, yes_label="Open the chat", danger=False), answered)
            return
        if block is None:
            self.post_message(self.ResumeRequested(e.path, e.sha, e.title))
            return
        self.notify(block[:1].upper() + block[1:], title="Cannot resume here", severity="warning", markup=False)
        self._load_transcript(e, f"cannot resume: {block}")

    def action_view_text(self) -> None:
        e = self.selected
        if e is not None:
            self._load_transcript(e, "")

    @work(thread=True, group="io", description="read a transcript")
    def _load_transcript(self, e: KvEntry, note: str) -> None:
        try:
            text = cache_scan.read_transcript(e, TRANSCRIPT_CAP)
        except (OSError, ValueError) as exc:
            self.app.call_from_thread(self.notify, f"No text to show: {exc}", severity="error", markup=False)
            return
        self.post_message(self._Transcript(self.name_of(e).text, text, note))
