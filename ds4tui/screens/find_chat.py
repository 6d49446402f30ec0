"""Find a chat (ctrl+f): search every stored chat's title and messages (every branch), see
the matching line and how it would open, Enter opens it.

Owns the search box and the result list; the search runs on a thread worker (it reads the
store and checks files) through the controller's `search` (chat/backend.py). Dismisses with
the chosen chat's id.
Everything from a file is shown as plain text (format.display), never markup.
"""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ds4tui.format.display import one_line


MIN_QUERY = 2  # characters before a search runs (one matches nearly every file)
HINT = "Type at least 2 characters · Enter goes to the results, Enter again opens · Escape closes"


class FindChatScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    FindChatScreen { align: center middle; }
    FindChatScreen > Vertical { width: 90%; height: 80%; border: thick $accent; background: $surface; padding: 0 1; }
    FindChatScreen OptionList { height: 1fr; }
    FindChatScreen .summary { color: $text-muted; height: 1; }
    """
    BINDINGS = [Binding("escape", "dismiss_none", "Close")]

    def __init__(self, controller) -> None:
        super().__init__()
        self.controller = controller
        self._ids: list[str] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Input(placeholder="Find a chat: words in a title or a message · Enter opens", id="query")
            yield Static("", classes="summary")
            yield OptionList(id="results")

    def on_mount(self) -> None:
        self.query_one("#query", Input).focus()
        self._hint()

    def _hint(self) -> None:
        self.query_one(".summary", Static).update(Text(HINT))

    @on(Input.Changed, "#query")
    def _changed(self, event: Input.Changed) -> None:
        if len(event.value.strip()) >= MIN_QUERY:
            self._search(event.value.strip())
        else:  # results of a longer query would stay up, matching nothing typed
            self.workers.cancel_group(self, "find")
            self.query_one("#results", OptionList).clear_options()
            self._ids = []
            self._hint()

    @on(Input.Submitted, "#query")
    def _submitted(self) -> None:
        results = self.query_one("#results", OptionList)
        if results.option_count:
            results.focus()
            results.highlighted = 0

    @work(thread=True, exclusive=True, group="find")
    def _search(self, pattern: str) -> None:
        try:
            hits = self.controller.search(pattern)
        except Exception as exc:  # an unreadable directory: say so in the summary
            self.app.call_from_thread(self._show, pattern, [], str(exc))
            return
        self.app.call_from_thread(self._show, pattern, hits, None)

    def _show(self, pattern: str, hits: list, error: str | None) -> None:
        if pattern != self.query_one("#query", Input).value.strip():
            return  # an older search, finished after the query changed
        results = self.query_one("#results", OptionList)
        results.clear_options()
        self._ids = []
        for hit in hits:
            line = Text(one_line(hit.title, 40), style="bold")
            line.append(f"  {hit.role}: ", style="dim")
            line.append(one_line(hit.line, 80))
            line.append(f"\n   {hit.chat_id[:8]} · {hit.how}", style="dim")
            results.add_option(Option(line))
            self._ids.append(hit.chat_id)
        summary = error or f"{len(hits)} match(es) for {one_line(pattern, 40)}"
        self.query_one(".summary", Static).update(Text(summary))

    @on(OptionList.OptionSelected, "#results")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        if 0 <= event.option_index < len(self._ids):
            self.dismiss(self._ids[event.option_index])

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
