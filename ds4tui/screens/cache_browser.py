"""The cache browser: every `.kv` file of a cache directory, decoded, live, with actions.

Owns: the screen that lists the directory (`KvTable`), shows the selected file
(`KvDetail`), the budget gauge, the filter, and the actions pin/unpin, delete
(confirmed; a pinned file twice), rename a titled session, view the
transcript, the eviction dry run, and resume. The directory is watched
(`ds4tui.cache.watch`), so files that another process writes, touches, evicts
or deletes show up within a second, with the cursor kept on the same SHA.
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

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.events import ScreenResume
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from ds4tui import paths
from ds4tui.cache.entry import ANY_DS4TUI, Acceptor, KvEntry
from ds4tui.cache.eviction import EvictionPlan
from ds4tui.cache.store import KvStore
from ds4tui.cache.watch import CacheChanges, CacheWatcher
from ds4tui.chat.conversation import MAX_TITLE_CHARS
from ds4tui.format.display import human_bytes, one_line
from ds4tui.cache import scan as cache_scan
from ds4tui.screens.widgets.budget_gauge import NARROW_BELOW, BudgetGauge
from ds4tui.screens.widgets.cache_map import CacheMap, by_kind
from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog
from ds4tui.screens.widgets.eviction_preview import EvictionPreview
from ds4tui.screens.widgets.file_names import FileName, name_files, name_of
from ds4tui.screens.widgets.kv_detail import KvDetail, KvDetailInfo
from ds4tui.screens.widgets.kv_format import DEFAULT_DISK_MB_S, DEFAULT_PREFILL_TOK_S, ResumeCost, safe_cell
from ds4tui.screens.widgets.kv_table import KvTable
from ds4tui.screens.widgets.prompt_dialog import PromptDialog
from ds4tui.screens.widgets.transcript_view import TranscriptView

if TYPE_CHECKING:  # only its attributes are read; the browser never needs the engine loaded
    from ds4tui.engine.model import ModelInfo

def short_dir(path) -> str:
    """The directory as people write it: the home directory as `~`."""
    text, home = str(path), os.path.expanduser("~")
    if home not in ("", "/", "~") and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home):]
    return text


# The transcript modal reads at most this much text.
TRANSCRIPT_CAP = 16 << 20
# Relative times ("5m ago") and decayed hits go stale; a slow rescan keeps them honest.
RESCAN_INTERVAL_S = 60.0


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

    def _start_watching(self) -> None:
        try:
            # The cache directory is ours to create (the store does so on its first save).
            self.store.dir.mkdir(parents=True, exist_ok=True)
            self._watcher = CacheWatcher(self.store.dir, self._from_watcher).start()
        except OSError as exc:
            self.notify(f"not watching {self.store.dir}: {exc}", severity="warning", markup=False)

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def on_screen_resume(self, event: ScreenResume) -> None:
        # Shown for the first time, or back from a dialog or the chat: files may have changed.
        self.rescan()

    def _from_watcher(self, changes: CacheChanges) -> None:
        # The watcher's thread; post_message is thread-safe.
        self.post_message(self._Changed(changes))

    @on(_Changed)
    def _on_changed(self, event: _Changed) -> None:
        if event.changes.directory_gone:
            # The old watch died with the directory (someone cleared the disposable
            # cache); watch a fresh one so later saves still show up.
            self.notify(f"{self.store.dir} was removed; watching a new empty one", severity="warning", markup=False)
            self._stop_watching()
            self._start_watching()
        self.rescan()

    # -- scanning ----------------------------------------------------------------

    def rescan(self) -> None:
        """Re-read the directory in a worker; `Refreshed` follows."""
        self._gen += 1
        self._scan_worker(self._gen)

    @work(thread=True, group="scan", description="scan the cache directory")
    def _scan_worker(self, gen: int) -> None:
        result = cache_scan.scan(self.store, self.acceptor, gen=gen, now=self._clock(), texts=self._texts,
                                 model_fingerprint=self.model.fingerprint if self.model else None,
                                 checksums=self._checksums)
        self.post_message(self._Scanned(result, name_files(result, self._texts)))

    @on(_Scanned)
    def _on_scanned(self, event: _Scanned) -> None:
        if event.scan.gen < self._shown_gen:
            return  # an older scan finished after a newer one
        self._shown_gen = event.scan.gen
        self._scan = event.scan
        self._names = event.names
        self._by_sha = {e.sha: e for e in event.scan.entries if e.sha}
        entries = event.scan.entries
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
        self._select_next = None
        self._show_detail()
        self.post_message(self.Refreshed(tuple(table.shas)))

    def _matches(self, e: KvEntry) -> bool:
        """The filter: titles, stored text, and the name a checkpoint is shown under."""
        if self._texts.matches(e, self._filter):
            return True
        name = self._names.get(e.path)
        return name is not None and self._filter.casefold() in name.text.casefold()

    def name_of(self, e: KvEntry) -> FileName:
        """What the table calls `e` (file_names.py)."""
        return self._names.get(e.path) or name_of(e, self._scan, None)

    @on(KvTable.Sorted)
    def _on_sorted(self, event: KvTable.Sorted) -> None:
        self._show_sort(event.description)

    def _show_sort(self, description: str) -> None:
        self.query_one("#browser-sort", Static).update(Text(f"sorted by {description}", style="dim"))

    # -- the detail pane -----------------------------------------------------------

    @property
    def selected(self) -> KvEntry | None:
        """The entry under the table's cursor."""
        sha = self.query_one(KvTable).selected_sha
        return self._by_sha.get(sha) if sha else None

    @property
    def detail_sha(self) -> str | None:
        """SHA of the file the detail pane shows now."""
        return self._detail_of.sha if self._detail_of is not None else None

    def _resume_block(self, e: KvEntry) -> str | None:
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

    @on(DataTable.RowHighlighted, "#browser-table")
    def _on_highlight(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    @on(DataTable.RowSelected, "#browser-table")
    def _on_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_resume()

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

    # -- actions -----------------------------------------------------------------

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
        self.notify(block, title="Cannot resume here", severity="warning", markup=False)
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
            self.app.call_from_thread(self.notify, f"no text to show: {exc}", severity="error", markup=False)
            return
        self.post_message(self._Transcript(self.name_of(e).text, text, note))

    @on(_Transcript)
    def _on_transcript(self, event: _Transcript) -> None:
        self.app.push_screen(TranscriptView(event.title, event.text, note=event.note))

    def action_toggle_pin(self) -> None:
        e = self.selected
        if e is None:
            return
        if e.header is None:
            self.notify("cannot pin: the header does not decode", severity="error", markup=False)
            return
        pin = not e.pinned
        label = self.name_of(e).text[:48] or e.sha[:12]
        self._io(lambda: self.store.set_pinned(e.sha, pin), f"{'Pinned' if pin else 'Unpinned'} {label}",
                 f"could not {'pin' if pin else 'unpin'} {label}", select=e.sha)

    def action_delete(self) -> None:
        e = self.selected
        if e is None:
            return
        name = self.name_of(e)
        if name.kind == "title":
            what = Text("Delete the chat ")
            what.append_text(safe_cell(e.title, 60, "bold"))
        elif name.kind == "chat":
            what = Text(f"Delete this {e.header.reason if e.header else ''} checkpoint of the chat ")
            what.append_text(safe_cell(name.chat_title, 60, "bold"))
            what.append(" (the chat itself stays)")
        else:
            what = Text("Delete the checkpoint ")
            what.append(name.text[:60] or "(no text)", "italic")
        what.append(f"\n{e.sha[:12]}, {human_bytes(e.file_bytes)}, {e.header.tokens if e.header else '?'} tokens?")

        def second(yes: bool | None) -> None:
            if yes:
                self._delete(e)

        def first(yes: bool | None) -> None:
            if not yes:
                return
            if e.pinned:
                again = Text.assemble(("This file is PINNED", "bold magenta"),
                                      ": it was kept on purpose and eviction never removes it. Delete it anyway?")
                self.app.push_screen(ConfirmDialog(again, yes_label="Delete pinned"), second)
            else:
                self._delete(e)

        self.app.push_screen(ConfirmDialog(what, yes_label="Delete"), first)

    def _delete(self, e: KvEntry) -> None:
        label = self.name_of(e).text[:48] or e.sha[:12]
        self._io(lambda: self.store.delete(e.sha), f"Deleted {label}", f"{label} was already gone")

    def action_rename(self) -> None:
        e = self.selected
        if e is None:
            return
        if e.header is None or not e.header.titled or e.title is None:
            self.notify("only titled sessions have a name to change", severity="warning", markup=False)
            return

        def done(title: str | None) -> None:
            title = (title or "").strip()
            if not title or title == e.title:
                return
            self._rename(e, title)

        self.app.push_screen(PromptDialog(Text("New title for this session:"), e.title, max_length=MAX_TITLE_CHARS), done)

    @work(thread=True, group="io", description="rename a titled session")
    def _rename(self, e: KvEntry, title: str) -> None:
        try:
            new_sha = self.store.rename_title(e.sha, title)
        except (OSError, ValueError) as exc:
            self.app.call_from_thread(self.notify, f"rename failed: {exc}", severity="error", markup=False)
            return
        self._select_next = new_sha
        self.app.call_from_thread(self.notify, f"Renamed to “{one_line(title, 60)}”", markup=False)
        self.app.call_from_thread(self.rescan)

    def action_eviction(self) -> None:
        self._eviction_worker()

    @work(thread=True, group="io", description="eviction dry run")
    def _eviction_worker(self) -> None:
        # A shallow scan, as a real budget pass does, so the preview matches it exactly.
        entries = self.store.score(self.store.scan())
        for e in entries:
            # A shallow scan reads no text; borrow what the table already knows, for display.
            known = self._by_sha.get(e.sha)
            if known is not None:
                e.title, e.text_preview = known.title, known.text_preview
        plan = EvictionPlan.build(entries, self.store.budget_bytes)
        self.app.call_from_thread(self.app.push_screen, EvictionPreview(plan))

    @work(thread=True, group="io", description="cache file operation")
    def _io(self, op: Callable[[], bool], ok_msg: str, fail_msg: str, select: str | None = None) -> None:
        ok = op()
        if select:
            self._select_next = select
        self.app.call_from_thread(self.notify, ok_msg if ok else fail_msg, severity="information" if ok else "warning", markup=False)
        self.app.call_from_thread(self.rescan)
