"""The cache browser: every `.kv` file of a cache directory, decoded, live, with actions.

Owns: the screen that lists the directory (`KvTable`), shows the selected file
(`KvDetail`), the budget gauge, the filter, and the actions pin/unpin, delete
(confirmed; a pinned file twice), rename a titled session, view the
transcript, the eviction dry run, and resume. The directory is watched
(`ds4tui.cache.watch`), so files that another process writes, touches, evicts
or deletes show up within a second, with the cursor kept on the same SHA.
This class keeps the layout, bindings, messages, state and the `@on` handlers
(Textual collects those only from the Screen class itself); beside it, mixed in,
one job each: cache_browser_live.py (watch, scan, filter, show the table),
cache_browser_detail.py (the selected file and its detail pane),
cache_browser_open.py (resume, the transcript), cache_browser_actions.py (pin,
delete, rename, the eviction dry run).
Leaves to the cache core (`KvStore`) every file operation and every verdict,
and to the app what resuming means.

Contract with the app (the chat pushes this screen; `ds4tui browse` shows it alone):

    screen = CacheBrowserScreen(store_or_dir, model=info, ctx_size=n,
                                prefill_tok_s=measured, disk_mb_s=measured)
    app.push_screen(screen)

- Resume posts `CacheBrowserScreen.ResumeRequested(path, sha, title)`; it
  bubbles to the app (`on_cache_browser_screen_resume_requested`), which pops
  the browser and opens the conversation in the chat with no prefill. A
  titled session (`.titled`) is a saved conversation; an untitled checkpoint
  is a prompt prefix: the app may open its parsed text as a new conversation
  (its next prompt then restores the file) or say it has nothing to resume. The
  screen posts it only for a file the given model can load (valid under its
  `Acceptor`, and for ds4tui payloads the same fingerprint); with no model
  (standalone browse) any file a ds4tui engine can load qualifies. Otherwise
  the screen says why and shows the transcript read-only, and posts nothing.
- After each refresh of the table the screen posts `Refreshed(shas)` (the SHAs
  in display order): tests and the app can wait on it.
- Escape/q closes: `dismiss()` when pushed, `app.exit()` when it is the only screen.

Numbers for the resume cost: `disk_mb_s` and `prefill_tok_s` when the app
measured them, else `kv_format.DEFAULT_DISK_MB_S` / `DEFAULT_PREFILL_TOK_S`.
`clock` is injectable so relative times and scores are deterministic in tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.events import ScreenResume
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from ds4tui import paths
from ds4tui.cache import scan as cache_scan
from ds4tui.cache.entry import ANY_DS4TUI, Acceptor, KvEntry
from ds4tui.cache.store import KvStore
from ds4tui.cache.watch import CacheChanges, CacheWatcher
from ds4tui.screens.cache_browser_actions import FileActions
from ds4tui.screens.cache_browser_detail import FileDetail
from ds4tui.screens.cache_browser_live import LiveListing
from ds4tui.screens.cache_browser_open import FileOpening
from ds4tui.screens.widgets.budget_gauge import NARROW_BELOW, BudgetGauge
from ds4tui.screens.widgets.cache_map import CacheMap
from ds4tui.chat.file_names import FileName
from ds4tui.screens.widgets.kv_detail import KvDetail
from ds4tui.screens.widgets.kv_format import DEFAULT_DISK_MB_S, DEFAULT_PREFILL_TOK_S, safe_cell
from ds4tui.screens.widgets.kv_table import KvTable
from ds4tui.screens.widgets.transcript_view import TranscriptView

if TYPE_CHECKING:  # only its attributes are read; the browser never needs the engine loaded
    from ds4tui.engine.model import ModelInfo


def short_dir(path) -> str:
    """The directory as people write it: the home directory as `~`."""
    text, home = str(path), os.path.expanduser("~")
    if home not in ("", "/", "~") and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home):]
    return text


# Relative times ("5m ago") and decayed hits go stale; a slow rescan keeps them honest.
RESCAN_INTERVAL_S = 60.0


class CacheBrowserScreen(LiveListing, FileDetail, FileOpening, FileActions, Screen[None]):
    """Every `.kv` file of one directory, decoded and live. See the module docstring for the contract."""

    CSS_PATH = "cache_browser.tcss"
    AUTO_FOCUS = "KvTable"

    BINDINGS = [
        Binding("enter", "resume", "Resume", priority=False),
        Binding("p", "toggle_pin", "Pin"),
        Binding("d,delete", "delete", "Delete"),
        Binding("t", "rename", "Rename"),
        Binding("v", "view_text", "Text"),
        Binding("e", "eviction", "Evict?"),
        Binding("slash", "focus_filter", "Filter"),
        Binding("escape,q", "close", "Close"),
    ]
    """
    | Key | Description |
    | :- | :- |
    | enter | Resume the selected conversation (or show why not, read-only). |
    | p | Pin / unpin (a pinned file is never evicted). |
    | d, delete | Delete (confirmed; a pinned file asks twice). |
    | t | Rename a titled session. |
    | v | Show the whole transcript, read-only. |
    | e | Eviction dry run: what would go, in which order. |
    | / | Focus the filter (titles and text). |
    | escape, q | Leave the filter, else close the browser. |
    """

    class ResumeRequested(Message):
        """Open this file's conversation in the chat. Handler: `on_cache_browser_screen_resume_requested`."""

        def __init__(self, path: str, sha: str, title: str | None) -> None:
            super().__init__()
            self.path = path
            self.sha = sha
            self.title = title

        @property
        def titled(self) -> bool:
            """A saved conversation (resumable by SHA); else a cached prompt prefix."""
            return self.title is not None

    class Refreshed(Message):
        """The table now shows `shas` (display order). Handler: `on_cache_browser_screen_refreshed`."""

        def __init__(self, shas: tuple[str, ...]) -> None:
            super().__init__()
            self.shas = shas

    class _Scanned(Message):
        def __init__(self, scan: cache_scan.BrowserScan, names: dict[str, FileName]) -> None:
            super().__init__()
            self.scan = scan
            self.names = names

    class _Changed(Message):
        def __init__(self, changes: CacheChanges) -> None:
            super().__init__()
            self.changes = changes

    class _Transcript(Message):
        def __init__(self, title: str | None, text: bytes, note: str) -> None:
            super().__init__()
            self.title, self.text, self.note = title, text, note

    def __init__(
        self,
        store: KvStore | str | os.PathLike | None = None,
        *,
        model: ModelInfo | None = None,
        ctx_size: int | None = None,
        prefill_tok_s: float | None = None,
        disk_mb_s: float | None = None,
        clock: Callable[[], float] | None = None,
        watch: bool = True,
        open_shas: frozenset[str] = frozenset(),
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """
        Args:
            store: the cache (its directory and budget), or a directory for a default store;
                None: `paths.cache_dir()` with the default budget.
            model: the running model; files it cannot load are marked and never resumed.
            ctx_size: the chat session's context size (a file for a larger one is refused).
            prefill_tok_s: measured prefill speed of `model`, for the resume cost.
            disk_mb_s: measured disk read speed, for the resume cost.
            clock: "now" in Unix seconds (tests freeze it); default `time.time`.
            watch: follow the directory live (tests of single actions can turn it off).
            open_shas: the titled sessions open in the chat (deleting one says it comes back).
        """
        super().__init__(name=name, id=id, classes=classes)
        self._clock = clock or time.time
        if store is None:
            store = paths.cache_dir()
        self.store = store if isinstance(store, KvStore) else KvStore(store, clock=self._clock)
        self.model = model
        # The same test the chat's checkpoints apply before loading (chat/checkpoints.py).
        self.acceptor = (Acceptor(model_id=model.model_id, payload_abi=model.payload_abi, ctx_size=ctx_size,
                                  quant_bits=model.quant_bits)
                         if model is not None else ANY_DS4TUI)
        self.prefill_tok_s = prefill_tok_s or DEFAULT_PREFILL_TOK_S
        self.disk_mb_s = disk_mb_s or DEFAULT_DISK_MB_S
        self._watch = watch
        self.open_shas = open_shas
        self._watcher: CacheWatcher | None = None
        self._gen = 0
        self._shown_gen = -1
        self._scan: cache_scan.BrowserScan | None = None
        self._by_sha: dict[str, KvEntry] = {}
        self._texts = cache_scan.TextIndex()
        self._checksums = cache_scan.ChecksumIndex()
        self._names: dict[str, FileName] = {}
        self._filter = ""
        self._select_next: str | None = None
        self._detail_of: KvEntry | None = None

    # -- layout and lifecycle ---------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="browser-top"):
            yield Static(safe_cell(short_dir(self.store.dir), 200), id="browser-dir", markup=False)
            yield Static("", id="browser-sort", markup=False)
            yield BudgetGauge(id="browser-gauge")
        yield CacheMap(id="browser-map")
        yield Input(placeholder="/ filter titles and text", id="browser-filter", compact=True)
        yield KvTable(id="browser-table")
        yield KvDetail(id="browser-detail")
        yield Footer(compact=True)

    def on_resize(self, event) -> None:
        # At 80 columns the header keeps the gauge's numbers and the pinned count; the
        # directory gives way first, then the sort label (the table underlines the sort column).
        narrow = event.size.width < NARROW_BELOW
        self.query_one(BudgetGauge).narrow = narrow
        self.query_one("#browser-sort").display = not narrow

    def on_mount(self) -> None:
        if self._watch:
            self._start_watching()
        self.set_interval(RESCAN_INTERVAL_S, self.rescan)

    def on_unmount(self) -> None:
        self._stop_watching()

    def on_screen_resume(self, event: ScreenResume) -> None:
        # Shown for the first time, or back from a dialog or the chat: files may have changed.
        self.rescan()

    # -- the live listing (LiveListing) ------------------------------------------------

    @on(_Changed)
    def _on_changed(self, event: _Changed) -> None:
        self._directory_changed(event.changes)  # LiveListing

    @on(_Scanned)
    def _on_scanned(self, event: _Scanned) -> None:
        self._show_scan(event.scan, event.names)  # LiveListing

    @on(KvTable.Sorted)
    def _on_sorted(self, event: KvTable.Sorted) -> None:
        self._show_sort(event.description)

    # -- the detail pane (FileDetail) ----------------------------------------------

    @on(DataTable.RowHighlighted, "#browser-table")
    def _on_highlight(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    @on(DataTable.RowSelected, "#browser-table")
    def _on_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_resume()  # FileOpening

    # -- filter -----------------------------------------------------------------

    @on(Input.Changed, "#browser-filter")
    def _on_filter(self, event: Input.Changed) -> None:
        self._filter = event.value.strip()
        self._apply()

    @on(Input.Submitted, "#browser-filter")
    def _on_filter_submitted(self, event: Input.Submitted) -> None:
        self.query_one(KvTable).focus()

    def action_focus_filter(self) -> None:
        self.query_one("#browser-filter", Input).focus()

    # -- closing, and the transcript FileOpening read ------------------------------

    def action_close(self) -> None:
        """Escape/q: clear and leave the filter first (a filter left applied hides files), else close."""
        box = self.query_one("#browser-filter", Input)
        if self.focused is box or box.value:
            box.value = ""  # Input.Changed re-applies the empty filter
            self._filter = ""
            self._apply()
            self.query_one(KvTable).focus()
        elif len(self.app.screen_stack) > 1:
            self.dismiss(None)
        else:
            self.app.exit()

    @on(_Transcript)
    def _on_transcript(self, event: _Transcript) -> None:
        self.app.push_screen(TranscriptView(event.title, event.text, note=event.note))

