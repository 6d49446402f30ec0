"""A tiny host app for the cache browser tests: pushes the screen, records what it posts."""

from __future__ import annotations

from textual import on
from textual.app import App

from ds4tui.engine.model import ModelInfo
from ds4tui.screens.cache_browser import CacheBrowserScreen
from tests.ui.kv_fixtures import ABI_DS4TUI, FINGERPRINT, LLAMA, NOW
from tests.ui.toasts import KeepsToasts
from tests.ui.waiting import until

TEST_MODEL = ModelInfo(name="test-llama", family="llama", model_id=LLAMA, quant_bits=4,
                       fingerprint=FINGERPRINT, n_ctx=8192, payload_abi=ABI_DS4TUI)


class BrowserHost(KeepsToasts, App):
    """Stands in for the chat app: pushes the browser and keeps its messages."""

    def __init__(self, directory, **kwargs) -> None:
        super().__init__()
        kwargs.setdefault("clock", lambda: NOW)
        self.browser = CacheBrowserScreen(directory, **kwargs)
        self.refreshes: list[tuple[str, ...]] = []
        self.resumes: list[CacheBrowserScreen.ResumeRequested] = []

    def on_mount(self) -> None:
        self.push_screen(self.browser)

    @on(CacheBrowserScreen.Refreshed)
    def _refreshed(self, message: CacheBrowserScreen.Refreshed) -> None:
        self.refreshes.append(message.shas)

    @on(CacheBrowserScreen.ResumeRequested)
    def _resume(self, message: CacheBrowserScreen.ResumeRequested) -> None:
        self.resumes.append(message)

    @property
    def shown(self) -> tuple[str, ...]:
        """The SHAs of the last refresh, in display order."""
        return self.refreshes[-1] if self.refreshes else ()


async def select(pilot, sha: str) -> None:
    """Put the table cursor on `sha` and wait until the detail pane follows."""
    browser = pilot.app.browser
    table = browser.query_one("#browser-table")
    table.move_cursor(row=table.get_row_index(sha), animate=False)
    await until(pilot, lambda: browser.detail_sha == sha, f"the detail of {sha[:8]}")
