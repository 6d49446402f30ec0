"""The cache browser's detail pane: the file under the cursor, decoded and named.

Owns: `FileDetail`, mixed into `CacheBrowserScreen`: which entry is selected, the
name the table gives a file (file_names.py), why a file cannot be resumed here, and
everything the detail pane shows (`KvDetailInfo`: raw header, fingerprint, resume
cost, the saves of the same chat for the timeline), re-rendered only when the
selected entry changed.
Leaves the drawing to `widgets.kv_detail.KvDetail`.
"""

from __future__ import annotations

from ds4tui.cache.entry import KvEntry
from ds4tui.chat.file_names import FileName, name_of
from ds4tui.screens.widgets.kv_detail import KvDetail, KvDetailInfo
from ds4tui.screens.widgets.kv_format import ResumeCost
from ds4tui.screens.widgets.kv_table import KvTable


class FileDetail:
    """The `CacheBrowserScreen` side of the selected file and its detail pane."""

    @property
    def selected(self) -> KvEntry | None:
        """The entry under the table's cursor."""
        sha = self.query_one(KvTable).selected_sha
        return self._by_sha.get(sha) if sha else None

    @property
    def detail_sha(self) -> str | None:
        """SHA of the file the detail pane shows now."""
        return self._detail_of.sha if self._detail_of is not None else None

    def name_of(self, e: KvEntry) -> FileName:
        """What the table calls `e` (file_names.py)."""
        return self._names.get(e.path) or name_of(e, self._scan.chats if self._scan is not None else None, None)

    def _resume_block(self, e: KvEntry) -> str | None:
        """Why `e` cannot be resumed with this model (shown, and the text opened read-only), or None."""
        if e.corrupt:
            return f"corrupt: {e.error}"
        return e.error

    def detail_info(self, e: KvEntry) -> KvDetailInfo:
        scan = self._scan
        cost = None
        if e.header is not None:
            cost = ResumeCost.estimate(e.file_bytes, e.header.tokens, disk_mb_s=self.disk_mb_s,
                                       prefill_tok_s=self.prefill_tok_s)
        return KvDetailInfo(
            entry=e, raw_header=scan.raw_headers.get(e.path, b"") if scan else b"",
            now=scan.now if scan else self._clock(), cost=cost,
            fingerprint=scan.fingerprints.get(e.path) if scan else None,
            model_fingerprint=self.model.fingerprint if self.model else None,
            resume_block=self._resume_block(e),
            name=self.name_of(e).text, chat_saves=self._chat_saves(e),
        )

    def _chat_saves(self, e: KvEntry) -> tuple[int, ...]:
        """created_at of every file of e's chat: its titled session and the checkpoints named after it."""
        name = self.name_of(e)
        chat = e.sha if name.kind == "title" else name.chat_sha
        if chat is None or self._scan is None:
            return (e.header.created_at,) if e.header else ()
        return tuple(sorted(f.header.created_at for f in self._scan.entries if f.header is not None and (
            f.sha == chat or self.name_of(f).chat_sha == chat)))

    def _show_detail(self) -> None:
        e = self.selected
        # Entries are fresh objects after every scan, so identity says "unchanged";
        # re-rendering the pane's rich tables on each filter keystroke is what costs.
        if e is self._detail_of and e is not None:
            return
        self._detail_of = e
        self.query_one(KvDetail).show(self.detail_info(e) if e else None)
