"""The cache browser's file actions: pin, delete, rename, and the eviction dry run.

Owns: `FileActions`, what `p` (pin/unpin), `d` (delete, confirmed; a pinned file asks
twice: confirm_dialog.confirm_delete, the chat's delete asks the same), `t` (retitle a
titled session) and `e` (what eviction would remove, in order) do to the file under the
listing's cursor. Every file operation runs in an `io` worker of the listing through
`KvStore`, then a notice says what happened and the listing rescans.
Leaves every verdict on a file to `KvStore`, and the dry-run plan to `cache.eviction`.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text

from ds4tui.cache.entry import KvEntry
from ds4tui.cache.eviction import EvictionPlan
from ds4tui.chat.conversation import MAX_TITLE_CHARS
from ds4tui.format.display import human_bytes, one_line
from ds4tui.format.kvc import title_sha
from ds4tui.screens.cache_listing import CacheListing
from ds4tui.screens.widgets.confirm_dialog import confirm_delete
from ds4tui.screens.widgets.eviction_preview import EvictionPreview
from ds4tui.screens.widgets.kv_format import reason_label, safe_cell
from ds4tui.screens.widgets.prompt_dialog import PromptDialog


class FileActions:
    """The actions that change files, on the file under `listing`'s cursor."""

    def __init__(self, listing: CacheListing, open_shas: frozenset[str] = frozenset()) -> None:
        """open_shas: the titled sessions open in the chat (deleting one says it comes back)."""
        self.listing = listing
        self.store = listing.store
        self.open_shas = open_shas

    def _label(self, e: KvEntry) -> str:
        return self.listing.name_of(e).text[:48] or e.sha[:12]

    def toggle_pin(self) -> None:
        e = self.listing.selected
        if e is None:
            return
        if e.header is None:
            self.listing.notify("Cannot pin: the header does not decode", severity="error", markup=False)
            return
        pin = not e.pinned
        label = self._label(e)
        done = f"{'Pinned' if pin else 'Unpinned'} {label}"
        if pin and e.header.quant_bits in (2, 4):  # a file ds4 lists: its own (docs/format.md, "Sharing a directory with ds4")
            done += " (against ds4tui only: ds4 ignores the pin and may still evict it)"
        self._io(lambda: self.store.set_pinned(e.sha, pin), done,
                 f"Could not {'pin' if pin else 'unpin'} {label}", select=e.sha)

    def delete(self) -> None:
        e = self.listing.selected
        if e is None:
            return
        name = self.listing.name_of(e)
        if name.kind == "title":
            # Only the file goes: a chat in the store keeps its messages (listed ◌, re-prefilled).
            what = Text("Delete the .kv file of the chat ")
            what.append_text(safe_cell(e.title, 60, "bold"))
        elif name.kind == "chat":
            what = Text(f"Delete this {reason_label(e.header.reason) if e.header else ''} checkpoint of the chat ")
            what.append_text(safe_cell(name.chat_title, 60, "bold"))
            what.append(" (the chat itself stays)")
        else:
            what = Text("Delete the checkpoint ")
            what.append(name.text[:60] or "(no text)", "italic")
        what.append(f"\n{e.sha[:12]}, {human_bytes(e.file_bytes)}, {e.header.tokens if e.header else '?'} tokens?")
        if e.sha in self.open_shas:  # deleting it does not close the chat
            what.append("\nThis chat is open: it is saved again after its next reply.", "italic")
        label = self._label(e)
        confirm_delete(self.listing.app, what, lambda: self._io(lambda: self.store.delete(e.sha), f"Deleted {label}",
                                                               f"Already gone: {label}"), pinned=int(e.pinned))

    def rename(self) -> None:
        e = self.listing.selected
        if e is None:
            return
        if e.header is None or not e.header.titled or e.title is None:
            self.listing.notify("Only titled sessions have a name to change", severity="warning", markup=False)
            return

        def done(title: str | None) -> None:
            title = (title or "").strip()
            if title and title != e.title:
                self.listing.run_worker(lambda: self._rename(e, title), thread=True, group="io",
                                        description="rename a titled session")

        self.listing.app.push_screen(PromptDialog(Text("New title for this session:"), e.title,
                                                  max_length=MAX_TITLE_CHARS), done)

    def _rename(self, e: KvEntry, title: str) -> None:
        """In an `io` worker."""
        app = self.listing.app
        # The cursor's target is named before the file moves: a periodic scan may list the
        # renamed file before this worker returns, and must already put the cursor on it.
        self.listing.select_after_scan(title_sha(title.encode("utf-8"), e.header.created_at))
        try:
            self.store.rename_title(e.sha, title)
        except (OSError, ValueError) as exc:
            self.listing.select_after_scan(None)
            app.call_from_thread(app.notify, f"Rename failed: {exc}", severity="error", markup=False)
            return
        app.call_from_thread(app.notify, f"Renamed to “{one_line(title, 60)}”", markup=False)
        app.call_from_thread(self.listing.rescan)

    def eviction(self) -> None:
        self.listing.run_worker(self._eviction_plan, thread=True, group="io", description="eviction dry run")

    def _eviction_plan(self) -> None:
        """In an `io` worker: a shallow scan, as a real budget pass does, so the preview matches it exactly."""
        entries = self.store.score(self.store.scan())
        for e in entries:
            # A shallow scan reads no text; borrow what the table already knows, for display.
            known = self.listing.by_sha.get(e.sha)
            if known is not None:
                e.title, e.text_preview = known.title, known.text_preview
        plan = EvictionPlan.build(entries, self.store.budget_bytes, self.store.overhead_bytes())
        app = self.listing.app
        app.call_from_thread(app.push_screen, EvictionPreview(plan))

    def _io(self, op: Callable[[], bool], ok_msg: str, fail_msg: str, select: str | None = None) -> None:
        """`op` in an `io` worker; then the notice, and a rescan."""
        app = self.listing.app

        def run() -> None:
            ok = op()
            if select:
                self.listing.select_after_scan(select)
            app.call_from_thread(app.notify, ok_msg if ok else fail_msg, severity="information" if ok else "warning",
                                 markup=False)
            app.call_from_thread(self.listing.rescan)

        self.listing.run_worker(run, thread=True, group="io", description="cache file operation")
