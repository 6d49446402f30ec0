"""The app of `ds4tui browse`: the cache browser alone, no model loaded.

Owns: hosting `CacheBrowserScreen` and turning its resume request into the
app's exit value (the SHA of a titled session; the command then starts the
chat on it). Leaves everything else to the screen.
"""

from __future__ import annotations

import os

from textual import on
from textual.app import App

from ds4tui.cache.store import KvStore
from ds4tui.screens.cache_browser import CacheBrowserScreen
from ds4tui.screens.terminal_watch import CHECK_EVERY_S, terminal_gone
from ds4tui.screens.theme_setting import ThemeSetting


class BrowseApp(App[str | None]):
    """`ds4tui browse`: the browser alone. Exits with the SHA to resume, or None."""

    TITLE = "ds4tui cache browser"

    def __init__(self, store: KvStore | str | os.PathLike, *, theme: str | None = None, **screen_kwargs) -> None:
        super().__init__()
        self._browser = CacheBrowserScreen(store, **screen_kwargs)
        self._theme = theme

    def on_mount(self) -> None:
        self.theme_setting = ThemeSetting(self, self._theme)
        # Pushed (not the default screen) so its CSS_PATH loads as it does in the chat;
        # closing it closes the app.
        self.push_screen(self._browser, lambda _: self.exit(None))
        self.set_interval(CHECK_EVERY_S, self._check_terminal)

    def _check_terminal(self) -> None:
        if terminal_gone():  # hung up (terminal_watch.py): nothing to resume
            self.exit(None)

    @on(CacheBrowserScreen.ResumeRequested)
    def _on_resume(self, event: CacheBrowserScreen.ResumeRequested) -> None:
        if not event.titled:
            # `ds4tui --resume` opens saved conversations; a prefix checkpoint is
            # reused on its own by any chat whose prompt starts with its text.
            self.notify("An untitled checkpoint is a cached prompt prefix, not a saved conversation: a chat whose"
                        " prompt starts with its text reuses it automatically.", title="Nothing to resume",
                        severity="warning", markup=False)
            return
        self.exit(event.sha)
