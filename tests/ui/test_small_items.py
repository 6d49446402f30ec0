"""The small items of issue 34: the footer's last column, toasts that stack past the bottom."""

from __future__ import annotations

from textual.widgets import Footer
from textual.widgets._toast import Toast

from ds4tui.screens.app import MAX_TOASTS
from ds4tui.screens.chat import ChatScreen
from tests.ui.chat_app import ChatHost, send
from tests.ui.waiting import until

SMALL = (80, 24)


async def test_no_stray_letter_after_the_palette_key_at_80_columns(tiny_llama):
    """A selected reply has more keys than 80 columns hold; the one scrolled under the docked
    "^p palette" showed its first letter in the last column ("^p palettef")."""
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SMALL) as pilot:
        await send(pilot, "hello")
        app.chat._pane(app.chat._active).log.last_assistant.focus()
        await pilot.pause(0.3)
        footer = app.chat.query_one(Footer)
        palette = footer.query_one(".-command-palette")
        await until(pilot, lambda: palette.region.width > 0, "the footer's keys")
        assert palette.region.right == footer.region.right == SMALL[0]  # it covers the last column


async def test_toasts_are_capped_and_long_ones_wrap(tiny_llama):
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        app.clear_notifications()
        app.notify("the error stays", severity="error", markup=False)
        for i in range(5):
            app.notify(f"note {i}: " + "saved in /a/rather/long/directory/name/" * (3 if i == 4 else 1),
                       markup=False)
        await until(pilot, lambda: len(app.chat.query(Toast)) == MAX_TOASTS, "the toasts")
        await pilot.pause(0.3)
        toasts = list(app.chat.query(Toast))
        shown = [t._notification.message for t in toasts]
        assert shown[0] == "the error stays" and shown[-1].startswith("note 4") and shown[1].startswith("note 3")
        for toast in toasts:
            assert toast.region.bottom <= SMALL[1] - 2  # above the status bar and the footer
            assert toast.region.right <= SMALL[0]
        assert toasts[-1].region.height >= 3  # the long one wraps, not cut
