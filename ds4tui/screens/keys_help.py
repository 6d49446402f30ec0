"""F1: the chat's keys on one screen, fitting 80x24.

Owns the list of the chat's keys as a user reads them (`CHAT_KEYS`) and the modal that
shows it. Textual's own "Keys" panel (in the palette) lists every binding of the focused
widget, mostly the message box's cursor keys, so the chat's own keys came last there.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

# (key, what it does), each one line in the 78-column box; docs/chat.md has the details.
CHAT_KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send the message"),
    ("ctrl+j", "new line (or shift+enter, where the terminal sends it)"),
    ("Escape", "stop this chat's reply or take back its queued message"),
    ("ctrl+c", "stop the reply of any chat; twice within 1 s: quit"),
    ("ctrl+r", "regenerate the last reply (the old one is kept)"),
    ("shift+tab", "select the last message (↑/↓ others), Enter: actions"),
    ("ctrl+n", "new chat"),
    ("ctrl+pageup/down", "previous / next open chat"),
    ("ctrl+b", "show / hide the chat list"),
    ("ctrl+f", "find a chat: titles and messages of every stored chat"),
    ("pageup/down", "scroll the transcript"),
    ("f2", "rename the chat"),
    ("f3", "settings: sampling, max tokens, system prompt"),
    ("f4", "cache browser: the .kv files (pin, delete, resume)"),
    ("ctrl+p", "command palette: the above, fork, export, model info"),
    ("f1", "this list"),
    ("ctrl+q", "save the live sessions and quit"),
)


# The chat list's markers (widgets/conversation_list.py), under the keys.
MARKERS = "chat list: ● in memory ○ on disk ▶ generating ↺ stored ◌ text only"


def keys_table() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, what in CHAT_KEYS:
        table.add_row(Text(key), Text(what))
    return table


class KeysHelpScreen(ModalScreen[None]):
    """The chat's keys; any of escape, q or f1 closes it."""

    DEFAULT_CSS = """
    KeysHelpScreen { align: center middle; }
    KeysHelpScreen > VerticalScroll {
        width: 78; max-width: 100%; height: auto; max-height: 100%;
        padding: 0 1; border: thick $primary; background: $surface;
        border-title-align: left;
    }
    """
    BINDINGS = [Binding("escape,q,f1", "close", "Close")]

    def compose(self) -> ComposeResult:
        scroll = VerticalScroll()
        scroll.border_title = "Keys · escape closes"
        with scroll:
            yield Static(keys_table())
            yield Static(Text(MARKERS, style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)
