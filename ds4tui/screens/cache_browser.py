"""The cache browser: every `.kv` file of a cache directory, decoded, live, with actions.

Owns: the screen, a composition of widgets that own their state and talk by messages:
`BrowserHeader` (the directory, the sort, the budget gauge), `CacheListing` (the map,
the filter and the table, kept live: the directory is watched, so files that another
process writes, touches, evicts or deletes show up within a second, with the cursor
kept on the same SHA) and `KvDetail` (the selected file); plus the keys, each handed
to the object that does it: `FileActions` (pin/unpin, delete (confirmed; a pinned file
twice), rename a titled session, the eviction dry run) and `FileOpening` (resume, view
the transcript). The screen relays the listing's messages to the header and the
detail pane, and posts the two messages of its contract.
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
from textual.events import ScreenResume
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer

from ds4tui import paths
from ds4tui.cache.entry import ANY_DS4TUI, Acceptor, KvEntry
from ds4tui.cache.store import KvStore
from ds4tui.chat.file_names import FileName
from ds4tui.screens.browser_header import BrowserHeader
from ds4tui.screens.cache_browser_actions import FileActions
from ds4tui.screens.cache_browser_detail import DetailContext, detail_info
from ds4tui.screens.cache_browser_open import FileOpening
from ds4tui.screens.cache_listing import CacheListing
from ds4tui.screens.widgets.kv_detail import KvDetail
from ds4tui.screens.widgets.kv_format import DEFAULT_DISK_MB_S, DEFAULT_PREFILL_TOK_S
from ds4tui.screens.widgets.kv_table import KvTable

if TYPE_CHECKING:  # only its attributes are read; the browser never needs the engine loaded
    from ds4tui.engine.model import ModelInfo


class CacheBrowserScreen(Screen[None]):
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
        acceptor = (Acceptor(model_id=model.model_id, payload_abi=model.payload_abi, ctx_size=ctx_size,
                             quant_bits=model.quant_bits)
                    if model is not None else ANY_DS4TUI)
        fingerprint = model.fingerprint if model is not None else None
        self._detail = DetailContext(model_fingerprint=fingerprint, disk_mb_s=disk_mb_s or DEFAULT_DISK_MB_S,
                                     prefill_tok_s=prefill_tok_s or DEFAULT_PREFILL_TOK_S)
        self.listing = CacheListing(self.store, acceptor, model_fingerprint=fingerprint, clock=self._clock,
                                    watch=watch, id="browser-listing")
        self.actions = FileActions(self.listing, open_shas)
        self.opening = FileOpening(self.listing, self._post_resume)

    def compose(self) -> ComposeResult:
        yield BrowserHeader(self.store.dir, id="browser-top")
        yield self.listing
        yield KvDetail(id="browser-detail")
        yield Footer(compact=True)

    def on_screen_resume(self, event: ScreenResume) -> None:
        # Shown for the first time, or back from a dialog or the chat: files may have changed.
        self.listing.rescan()

    # -- what tests and the app read -------------------------------------------------------

    @property
    def selected(self) -> KvEntry | None:
        """The entry under the table's cursor."""
        return self.listing.selected

    def name_of(self, e: KvEntry) -> FileName:
        """What the table calls `e` (file_names.py)."""
        return self.listing.name_of(e)

    @property
    def detail_sha(self) -> str | None:
        """SHA of the file the detail pane shows now."""
        info = self.query_one(KvDetail).info
        return info.entry.sha if info is not None else None

    # -- the listing's messages ------------------------------------------------------------

    @on(CacheListing.Scanned)
    def _on_scanned(self, event: CacheListing.Scanned) -> None:
        self.query_one(BrowserHeader).show_scan(event.scan, self.store.budget_bytes)

    @on(CacheListing.Shown)
    def _on_shown(self, event: CacheListing.Shown) -> None:
        self.query_one(BrowserHeader).show_sort(self.query_one(KvTable).sort_description)
        self.post_message(self.Refreshed(event.shas))

    @on(CacheListing.Highlighted)
    def _on_highlighted(self, event: CacheListing.Highlighted) -> None:
        e = event.entry
        self.query_one(KvDetail).show(detail_info(e, self.listing, self._detail, self._clock()) if e else None)

    @on(KvTable.Sorted)
    def _on_sorted(self, event: KvTable.Sorted) -> None:
        self.query_one(BrowserHeader).show_sort(event.description)

    @on(DataTable.RowSelected, "#browser-table")
    def _on_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.opening.resume()

    # -- the keys --------------------------------------------------------------------------

    def action_resume(self) -> None:
        self.opening.resume()

    def action_view_text(self) -> None:
        self.opening.view_text()

    def action_toggle_pin(self) -> None:
        self.actions.toggle_pin()

    def action_delete(self) -> None:
        self.actions.delete()

    def action_rename(self) -> None:
        self.actions.rename()

    def action_eviction(self) -> None:
        self.actions.eviction()

    def action_focus_filter(self) -> None:
        self.listing.focus_filter()

    def action_close(self) -> None:
        """Escape/q: clear and leave the filter first (a filter left applied hides files), else close."""
        if self.listing.leave_filter():
            return
        if len(self.app.screen_stack) > 1:
            self.dismiss(None)
        else:
            self.app.exit()

    def _post_resume(self, e: KvEntry) -> None:
        self.post_message(self.ResumeRequested(e.path, e.sha, e.title))
