"""The cache browser's live file list: the directory watched, scanned off the UI thread, filtered.

Owns: `CacheListing`, the widget holding the map, the filter box and the table, and
the state behind them: following the directory (`ds4tui.cache.watch`; a removed
directory is watched afresh), rescanning it in a worker (`rescan`; a scan that
finishes after a newer one is dropped; a slow periodic one keeps relative times
honest), the last scan and the names its files are shown under (file_names.py), the
filter over titles, text and those names, and keeping the cursor on the same SHA
(or on one named ahead, `select_after_scan`). It says what changed by messages:
`Scanned` (a new scan is shown: the gauge follows), `Shown` (the table now lists
these SHAs) and `Highlighted` (the file under the cursor is another one).
Leaves to the screen the gauge, the detail pane and every action on a file.
"""

from __future__ import annotations

from collections.abc import Callable

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input

from ds4tui.cache import scan as cache_scan
from ds4tui.cache.entry import Acceptor, KvEntry
from ds4tui.cache.store import KvStore
from ds4tui.cache.watch import CacheChanges, CacheWatcher
from ds4tui.chat.file_names import FileName, name_files, name_of
from ds4tui.screens.widgets.cache_map import CacheMap
from ds4tui.screens.widgets.kv_table import KvTable

# Relative times ("5m ago") and decayed hits go stale; a slow rescan keeps them honest.
RESCAN_INTERVAL_S = 60.0


class CacheListing(Vertical):
    """The map, the filter and the table of one cache directory, kept live."""

    DEFAULT_CSS = """
    CacheListing {
        height: auto;
    }
    """

    class Scanned(Message):
        """A new scan is shown (`scan`); handler: `on_cache_listing_scanned`."""

        def __init__(self, scan: cache_scan.BrowserScan) -> None:
            super().__init__()
            self.scan = scan

    class Shown(Message):
        """The table now lists `shas`, in display order; handler: `on_cache_listing_shown`."""

        def __init__(self, shas: tuple[str, ...]) -> None:
            super().__init__()
            self.shas = shas

    class Highlighted(Message):
        """The file under the cursor is now `entry` (None: no file); handler: `on_cache_listing_highlighted`."""

        def __init__(self, entry: KvEntry | None) -> None:
            super().__init__()
            self.entry = entry

    class _Scanned(Message):
        def __init__(self, scan: cache_scan.BrowserScan, names: dict[str, FileName]) -> None:
            super().__init__()
            self.scan = scan
            self.names = names

    class _Changed(Message):
        def __init__(self, changes: CacheChanges) -> None:
            super().__init__()
            self.changes = changes

    def __init__(self, store: KvStore, acceptor: Acceptor, *, model_fingerprint: bytes | None,
                 clock: Callable[[], float], watch: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.store = store
        self._acceptor = acceptor
        self._model_fingerprint = model_fingerprint
        self._clock = clock
        self._watch = watch
        self._watcher: CacheWatcher | None = None
        self._gen = 0
        self._shown_gen = -1
        self.scan: cache_scan.BrowserScan | None = None  # the last scan shown
        self.by_sha: dict[str, KvEntry] = {}
        self.names: dict[str, FileName] = {}  # path -> what the table calls the file
        self._texts = cache_scan.TextIndex()
        self._checksums = cache_scan.ChecksumIndex()
        self._filter = ""
        self._select_next: str | None = None
        self._highlighted: KvEntry | None = None

    def compose(self) -> ComposeResult:
        yield CacheMap(id="browser-map")
        yield Input(placeholder="/ filter titles and text", id="browser-filter", compact=True)
        yield KvTable(id="browser-table")

    def on_mount(self) -> None:
        if self._watch:
            self._start_watching()
        self.set_interval(RESCAN_INTERVAL_S, self.rescan)

    def on_unmount(self) -> None:
        self._stop_watching()

    # -- what the screen asks ---------------------------------------------------------

    @property
    def selected(self) -> KvEntry | None:
        """The entry under the table's cursor."""
        sha = self.query_one(KvTable).selected_sha
        return self.by_sha.get(sha) if sha else None

    def name_of(self, e: KvEntry) -> FileName:
        """What the table calls `e` (file_names.py)."""
        return self.names.get(e.path) or name_of(e, self.scan.chats if self.scan is not None else None, None)

    def select_after_scan(self, sha: str | None) -> None:
        """Put the cursor on `sha` once a scan lists it (a renamed file's new name)."""
        self._select_next = sha

    def focus_filter(self) -> None:
        self.query_one("#browser-filter", Input).focus()

    def leave_filter(self) -> bool:
        """Clear and leave the filter when it is focused or set (a filter left applied hides
        files); False when there was none."""
        box = self.query_one("#browser-filter", Input)
        if self.screen.focused is not box and not box.value:
            return False
        box.value = ""  # Input.Changed re-applies the empty filter
        self._filter = ""
        self._apply()
        self.query_one(KvTable).focus()
        return True

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

    @on(_Changed)
    def _directory_changed(self, event: _Changed) -> None:
        """The watcher saw a change: rescan (and watch afresh when the directory itself went)."""
        if event.changes.directory_gone:
            # The old watch died with the directory (someone cleared the disposable
            # cache); watch a fresh one so later saves still show up.
            self.notify(f"The directory {self.store.dir} was removed; watching a new empty one",
                        severity="warning", markup=False)
            self._stop_watching()
            self._start_watching()
        self.rescan()

    # -- scanning ---------------------------------------------------------------------

    def rescan(self) -> None:
        """Re-read the directory in a worker; `Scanned` and `Shown` follow."""
        self._gen += 1
        self._scan_worker(self._gen)

    @work(thread=True, group="scan", description="scan the cache directory")
    def _scan_worker(self, gen: int) -> None:
        """Two passes: every row from the header index first (no file read whole), then, when
        some checksums are still unknown, again once they have been read (whole files: seconds
        for a directory of large new files), so the first screen never waits for them."""
        for read_checksums in (False, True):
            result = cache_scan.scan(self.store, self._acceptor, gen=gen, now=self._clock(), texts=self._texts,
                                     model_fingerprint=self._model_fingerprint,
                                     checksums=self._checksums, read_checksums=read_checksums)
            self.post_message(self._Scanned(result, name_files(result, self._texts)))
            if not result.unchecked or gen != self._gen:
                return  # all known, or a newer scan has started

    @on(_Scanned)
    def _show_scan(self, event: _Scanned) -> None:
        """A scan finished: the map and the table show it, unless a newer one is shown."""
        scan = event.scan
        if scan.gen < self._shown_gen:
            return  # an older scan finished after a newer one
        self._shown_gen = scan.gen
        self.scan = scan
        self.names = event.names
        self.by_sha = {e.sha: e for e in scan.entries if e.sha}
        self.post_message(self.Scanned(scan))
        self.query_one(CacheMap).show(scan.entries)
        self._apply()

    # -- the filter and the table -------------------------------------------------------

    @on(Input.Changed, "#browser-filter")
    def _on_filter(self, event: Input.Changed) -> None:
        event.stop()
        self._filter = event.value.strip()
        self._apply()

    @on(Input.Submitted, "#browser-filter")
    def _on_filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(KvTable).focus()

    @on(DataTable.RowHighlighted, "#browser-table")
    def _on_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._follow_cursor()

    def _apply(self) -> None:
        """Show the last scan through the filter, keep the selection, follow the cursor."""
        if self.scan is None:
            return
        table = self.query_one(KvTable)
        visible = [e for e in self.scan.entries if self._matches(e)]
        table.show(visible, self.scan.now, select=self._select_next, names=self.names)
        if self._select_next in table.shas:  # else still pending: the file may not be listed yet
            self._select_next = None
        self._follow_cursor()
        self.post_message(self.Shown(tuple(table.shas)))

    def _follow_cursor(self) -> None:
        e = self.selected
        # Entries are fresh objects after every scan, so identity says "unchanged": the
        # detail's rich tables are not rebuilt on each filter keystroke.
        if e is self._highlighted and e is not None:
            return
        self._highlighted = e
        self.post_message(self.Highlighted(e))

    def _matches(self, e: KvEntry) -> bool:
        """The filter: titles, stored text, and the name a checkpoint is shown under."""
        if self._texts.matches(e, self._filter):
            return True
        name = self.names.get(e.path)
        return name is not None and self._filter.casefold() in name.text.casefold()
