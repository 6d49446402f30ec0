"""The small menu of one message's actions: copy, copy a code block, edit, fork, regenerate,
versions.

Owns: showing the choices beside the message (over the transcript, kept on screen), the
keys and clicks inside it, and closing (Escape, a choice, or focus elsewhere). A choice
is posted as the same `MessageAction` the message's own keys post, for the message the
menu was opened on, so the screen handles a key and a menu choice by one path.
Leaves to the screen: which actions a message offers (it knows the chat's state).
"""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from ds4tui.screens.widgets.chat_log import MessageAction

WIDTH = 40  # wide enough for "Copy code block 2: python, 12 lines  c"


def item_prompt(label: str, key: str, width: int = WIDTH - 4) -> Text:
    """The label, and its key dimmed at the right edge."""
    text = Text(label[: width - len(key) - 2])
    if key:
        text.append(" " * max(width - text.cell_len - len(key), 2))
        text.append(key, "dim")
    return text


class MessageMenu(OptionList):
    """The actions of `target` (a message widget): (action, label, key) triples, the first highlighted."""

    DEFAULT_CSS = f"""
    MessageMenu {{
        overlay: screen;
        position: absolute;
        width: {WIDTH};
        height: auto;
        max-height: 14;
        border: round $accent;
        border-title-color: $text-muted;
        background: $surface;
        padding: 0 1;
        &:focus {{ border: round $accent; }}
    }}
    """
    BINDINGS = [Binding("escape", "close", "Close menu", show=False)]

    def __init__(self, target: Widget, items: list[tuple[str, str, str]], *, title: str = "") -> None:
        # No fixed id: a menu opened while the last one is still being removed would clash.
        super().__init__(*(Option(item_prompt(label, key), id=action) for action, label, key in items))
        self.target = target
        # A one-key hint is also the item's accelerator inside the menu ("y" copies).
        self._keys = {key: action for action, _label, key in items if len(key) == 1}
        self.border_title = Text(title) if title else None
        self._dismissed = False

    def on_mount(self) -> None:
        self.target.add_class("-menu-open")  # the message stays framed while its menu is up
        self._place()
        self.highlighted = 0
        self.focus()

    def _place(self) -> None:
        """Beside the message's top right, moved up or left as far as it takes to stay on screen."""
        screen = self.screen.size
        box = self.target.region
        height = min(self.option_count + 2, 14)
        x = max(min(box.right - WIDTH - 1, screen.width - WIDTH), 0)
        y = max(min(box.y + 1, screen.height - height - 1), 0)
        self.styles.offset = (x, y)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        action = event.option.id
        self._close()
        if action and self.target.is_mounted:  # from the message, as its own keys post it
            self.target.post_message(MessageAction(action, self.target))

    def on_key(self, event) -> None:
        action = self._keys.get(event.character or "")
        if action is not None:
            event.stop()
            self._close()
            if self.target.is_mounted:
                self.target.post_message(MessageAction(action, self.target))

    def action_close(self) -> None:
        self._close()

    def on_blur(self) -> None:
        if not self._dismissed:  # a click elsewhere: the menu goes, what was clicked keeps the focus
            self._dismissed = True
            self.target.remove_class("-menu-open")
            self.remove()

    def discard(self) -> None:
        """Go without a word or a focus move: another menu is taking this one's place."""
        self._dismissed = True
        self.target.remove_class("-menu-open")
        self.remove()

    def _close(self) -> None:
        self._dismissed = True
        self.target.remove_class("-menu-open")
        if self.target.is_mounted:
            self.target.focus()  # back to the message, as a menu returns to where it opened
        self.remove()
