"""The cache browser's live listing: the directory watched, scanned off the UI thread, filtered.

Owns: `LiveListing`, mixed into `CacheBrowserScreen`: following the directory
(`ds4tui.cache.watch`; a removed directory is watched afresh), rescanning it in a
worker (`rescan`; a scan that finishes after a newer one is dropped), showing a
scan in the budget gauge, the map and the table (keeping the cursor on the same
SHA), the filter over titles, text and the names checkpoints are shown under,
and the sort label. Each shown table ends with the screen's `Refreshed` message.
Leaves to `CacheBrowserScreen` the state (`store`, `_scan`, `_by_sha`, `_names`,
`_filter`...) and the `@on` handlers that call in here.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.widgets import Static

from ds4tui.cache import scan as cache_scan
from ds4tui.cache.entry import KvEntry
from ds4tui.cache.watch import CacheChanges, CacheWatcher
from ds4tui.screens.widgets.budget_gauge import BudgetGauge
from ds4tui.screens.widgets.cache_map import CacheMap, by_kind
from ds4tui.chat.file_names import FileName, name_files
from ds4tui.screens.widgets.kv_table import KvTable


class LiveListing:
    """The `CacheBrowserScreen` side of watching, scanning and showing the directory."""

    # -- watching ---------------------------------------------------------------------

    def _start_watching(self) -> None:
        try:
            # The cache directory is ours to create (the store does so on its first save).
            self.store.dir.mkdir(parents=True, exist_ok=True)
            self._watcher = CacheWatcher(self.store.dir, self._from_watcher).start()
        except OSError as exc:
            self.notify(f"Not watching {self.store.dir}: {exc}", severity="warning", markup=False)

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _from_watcher(self, changes: CacheChanges) -> None:
        # The watcher's thread; post_message is thread-safe.
        self.post_message(self._Changed(changes))

    def _directory_changed(self, changes: CacheChanges) -> None:
        """The watcher saw a change: rescan (and watch afresh when the directory itself went)."""
        if changes.directory_gone:
            # The old watch died with the directory (someone cleared the disposable
            # cache); watch a fresh one so later saves still show up.
            self.notify(f"The directory {self.store.dir} was removed; watching a new empty one", severity="warning", markup=False)
            self._stop_watching()
            self._start_watching()
        self.rescan()

    # -- scanning ---------------------------------------------------------------------

    def rescan(self) -> None:
        """Re-read the directory in a worker; `Refreshed` follows."""
        self._gen += 1
        self._scan_worker(self._gen)

    @work(thread=True, group="scan", description="scan the cache directory")
    def _scan_worker(self, gen: int) -> None:
        """Two passes: every row from the header index first (no file read whole), then, when
        some checksums are still unknown, again once they have been read (whole files: seconds
        for a directory of large new files), so the first screen never waits for them."""
        for read_checksums in (False, True):
            result = cache_scan.scan(self.store, self.acceptor, gen=gen, now=self._clock(), texts=self._texts,
                                     model_fingerprint=self.model.fingerprint if self.model else None,
                                     checksums=self._checksums, read_checksums=read_checksums)
            self.post_message(self._Scanned(result, name_files(result, self._texts)))
            if not result.unchecked or gen != self._gen:
                return  # all known, or a newer scan has started

    def _show_scan(self, scan: cache_scan.BrowserScan, names: dict[str, FileName]) -> None:
        """A scan finished: the gauge, the map and the table show it, unless a newer one is shown."""
        if scan.gen < self._shown_gen:
            return  # an older scan finished after a newer one
        self._shown_gen = scan.gen
        self._scan = scan
        self._names = names
        self._by_sha = {e.sha: e for e in scan.entries if e.sha}
        entries = scan.entries
        self.query_one(BudgetGauge).set_usage(
            used_bytes=sum(e.file_bytes for e in entries), budget_bytes=self.store.budget_bytes,
            file_count=len(entries), pinned_count=sum(1 for e in entries if e.pinned), shares=by_kind(entries))
        self.query_one(CacheMap).show(entries)
        self._apply()

    def _apply(self) -> None:
        """Show the last scan through the filter, keep the selection, refresh the detail."""
        if self._scan is None:
            return
        table = self.query_one(KvTable)
        visible = [e for e in self._scan.entries if self._matches(e)]
        table.show(visible, self._scan.now, select=self._select_next, names=self._names)
        self._show_sort(table.sort_description)
        if self._select_next in table.shas:  # else still pending: the file may not be listed yet
            self._select_next = None
        self._show_detail()
        self.post_message(self.Refreshed(tuple(table.shas)))

    def _matches(self, e: KvEntry) -> bool:
        """The filter: titles, stored text, and the name a checkpoint is shown under."""
        if self._texts.matches(e, self._filter):
            return True
        name = self._names.get(e.path)
        return name is not None and self._filter.casefold() in name.text.casefold()

    def _show_sort(self, description: str) -> None:
        self.query_one("#browser-sort", Static).update(Text(f"sorted by {description}", style="dim"))
