"""The Textual application: the chat screen as the default screen, the palette, quitting.

Owns: app-wide wiring only (styles, command palette providers, ctrl+q saving
live sessions before exit). The chat itself lives in screens/chat.py; the
engine and the cache are reached only through the controller.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on
from textual.app import App
from textual.binding import Binding
from textual.widgets import Input, TextArea

from ds4tui.config import Config
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.commands import ChatCommands
from ds4tui.screens.terminal_watch import CHECK_EVERY_S, terminal_gone
from ds4tui.screens.theme_setting import ThemeSetting

if TYPE_CHECKING:
    from ds4tui.chat.backend import ChatBackend
    from ds4tui.engine.model import Model


APP_SWITCH_INTERVAL_S = 0.001
# Toasts on screen at once. More stacked past the bottom of an 80x24 terminal and were cut;
# the oldest go first (errors last: they say what went wrong).
MAX_TOASTS = 3


class Ds4TuiApp(App[None]):
    """`ds4tui`: a terminal chat on the embedded engine, with the disk KV cache."""

    # Absolute: a relative CSS_PATH resolves beside the module of the class that sets it,
    # and subclasses (tests, embedders) live elsewhere.
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "ds4tui"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        # Priority: over every screen, dialogs included (Textual's own ctrl+c only said "press
        # ctrl+q"), and before the message box, whose ctrl+c copies: a selection still does.
        Binding("ctrl+c", "interrupt", "Stop", show=False, priority=True),
    ]
    """
    | Key | Description |
    | :- | :- |
    | ctrl+q | Save live sessions, then quit. |
    | ctrl+c | Copy the selected text; else stop the running prefill or reply (any chat); twice within a second quits. |
    """

    def __init__(self, config: Config | None = None, *, model: Model | None = None,
                 controller: ChatBackend | None = None, resume: str | None = None,
                 cursor_blink: bool = True, imported: dict | None = None) -> None:
        """
        Args:
            config: Settings; the model named there is loaded in a worker.
            model: A loaded model (skips loading).
            controller: A ready controller (tests).
            resume: A titled session to open at start (sha prefix or title).
            cursor_blink: False keeps the cursor still (snapshot tests).
            imported: A transcript to open as a new chat ({"messages", "title", "created_at"}).
        """
        super().__init__()
        self.config = config or Config()
        self._screen_args = dict(model=model, controller=controller, resume=resume, cursor_blink=cursor_blink,
                                 imported=imported)

    def on_mount(self) -> None:
        self.theme_setting = ThemeSetting(self, self.config.theme)
        self.set_interval(CHECK_EVERY_S, self._check_terminal)
        # The decode worker needs the GIL for a moment between tokens, and while this thread
        # renders a streaming reply it waits out Python's switch interval (5 ms by default)
        # for it: replies streamed at ~140 tok/s in the app against ~350 headless. With 1 ms
        # they stream at ~185 (docs/perf-archive.md, "Streaming in the app").
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(APP_SWITCH_INTERVAL_S)

    def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)
        gc.unfreeze()

    @on(ChatScreen.ModelReady)
    def _freeze_heap(self) -> None:
        """Move every object alive once the model is ready (torch, the model, Textual's widgets
        and styles: ~250k of them) out of the garbage collector's reach. A full collection
        scanned them all in 100-140 ms holding the GIL, whenever allocations triggered one:
        a reply's first token then took ~175 ms instead of ~50, a stream stuttered. Frozen,
        a later collection scans only what came after (docs/perf-archive.md, "Pauses of the garbage
        collector"). They live for the whole run anyway; unmount gives them back."""
        gc.freeze()

    def _check_terminal(self) -> None:
        """A hung-up terminal (terminal_watch.py): save and quit as ctrl+q does."""
        if terminal_gone():
            self.chat.save_and_exit()

    def _refresh_notifications(self) -> None:
        """Textual shows every live notification; keep the newest MAX_TOASTS (errors kept longest)."""
        live = list(self._notifications)
        extra = len(live) - MAX_TOASTS
        if extra > 0:
            by_age = [n for n in live if n.severity != "error"] + [n for n in live if n.severity == "error"]
            for old in by_age[:extra]:
                del self._notifications[old]
        super()._refresh_notifications()

    def get_default_screen(self) -> ChatScreen:
        return ChatScreen(self.config, **self._screen_args)

    def get_system_commands(self, screen):
        """Textual's own entries, less its "Quit": the palette's one Quit is the chat's
        (commands.py), which saves live sessions first and says so."""
        for command in super().get_system_commands(screen):
            if command.title != "Quit":
                yield command

    @property
    def chat(self) -> ChatScreen:
        """The chat screen (the bottom of the screen stack)."""
        return self.screen_stack[0]  # type: ignore[return-value]

    def on_cache_browser_screen_resume_requested(self, message) -> None:
        """The cache browser asked to open a file: close it and open the file as a chat."""
        message.stop()
        if len(self.screen_stack) > 1:
            self.pop_screen()
        self.chat.open_file(message.sha)

    def action_interrupt(self) -> None:
        """ctrl+c: copy what is selected (in a text box, or on the screen by mouse), as Textual's
        widgets do; else the chat's stop (ChatTurns.interrupt), whichever screen is on top."""
        screen = self.screen
        focused = screen.focused
        selected = focused.selected_text if isinstance(focused, (Input, TextArea)) else None
        selected = selected or screen.get_selected_text()
        if selected:
            # The chat's copy route (screens/clipboard.py): says where the text went, with a
            # file fallback where OSC 52 cannot be trusted (tmux by default).
            from ds4tui.screens.clipboard import copy_text

            done = copy_text(selected, "the selection", self.copy_to_clipboard)
            self.notify(done.message, title="Clipboard", severity=done.severity, markup=False)
            return
        self.chat.interrupt()

    async def action_quit(self) -> None:
        """Save every live session (reason `shutdown`) before exiting."""
        self.chat.save_and_exit()
