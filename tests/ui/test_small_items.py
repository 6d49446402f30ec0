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

        def palette():  # the footer recomposes its keys when the focus moves
            found = footer.query(".-command-palette")
            return found.first() if found and found.first().region.width else None

        await until(pilot, lambda: palette() is not None and len(footer.children) > 8, "the footer's keys")
        await pilot.pause(0.3)
        assert palette().region.right == footer.region.right == SMALL[0]  # it covers the last column


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


def test_rows_with_the_same_title_read_apart():
    from ds4tui.screens.widgets.conversation_list import ChatEntry, twin_tags

    now = 1_000_000.0
    entries = [
        ChatEntry("New chat", key="a", when=now - 5),
        ChatEntry("New chat", key="b", when=now - 10),
        ChatEntry("Trip to Porto", chat_id="x", when=now - 7200),
        ChatEntry("trip to porto", chat_id="y", when=now - 120),  # an import beside its original
        ChatEntry("Trip to Porto", chat_id="z", when=now - 7200, model="gemma3-270m"),  # another model
        ChatEntry("Alone", key="c", when=now),
    ]
    assert twin_tags(entries, now) == [" · just now", " · just now #2", " · 2h ago", " · 2m ago", "", ""]


async def test_two_new_chats_are_told_apart_in_the_sidebar(tiny_llama):
    from ds4tui.screens.widgets.conversation_list import ChatItem, ConversationList

    app = ChatHost(tiny_llama)
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        mark = len(app.seen)
        await pilot.press("ctrl+n")
        await app.wait_for(ConversationList.Redrawn, lambda m: len(m.entries) == 2, after=mark)
        await pilot.pause()
        rows = [(str(i.query(".title").first().render()), str(i.query(".tag").first().render()))
                for i in app.chat.query(ChatItem)]
        assert len(rows) == 2 and rows[0] != rows[1], rows
        assert all("New chat" in title for title, _ in rows)


async def test_sidebar_ages_count_on_as_chats_ls_does(tiny_llama, tmp_path, monkeypatch):
    """Two stored chats titled alike carry their ages; minutes later the sidebar says what
    `ds4tui chats ls` says at that moment (the tags were worked out once, when drawn)."""
    import time as real_time

    from ds4tui.cli.chats import ID_CHARS, ls_lines
    from ds4tui.screens.widgets import conversation_list
    from ds4tui.screens.widgets.conversation_list import ChatItem, ConversationList
    from tests.ui.chat_app import chat_config

    monkeypatch.setattr(conversation_list, "AGE_REFRESH_S", 0.1)
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv"),
                                                  data_dir=str(tmp_path / "data")))
    async with app.run_test(size=(140, 40)) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        store = app.chat.controller.history.store
        start = real_time.time()
        ids = [store.create(title="Twin", messages=[{"role": "user", "content": f"twin {i}"}],
                            updated_at=start - ago) for i, ago in enumerate((20, 1500))]
        mark = len(app.seen)
        app.chat._scan_saved()
        await app.wait_for(ConversationList.Redrawn, lambda m: sum(e.chat_id in ids for e in m.entries) == 2,
                           after=mark)

        def tags() -> dict[str, str]:
            return {i.entry.chat_id: str(i.query(".tag").first().render()) for i in app.chat.query(ChatItem)
                    if i.entry.chat_id in ids}

        def ls_ages(now: float) -> dict[str, str]:
            chats = [c for c in store.list() if c.id in ids]
            rows = ls_lines(chats, now, 140, tmp_path / "kv")[1:]
            by_prefix = {row[:ID_CHARS]: row[ID_CHARS + 1:ID_CHARS + 9].strip() for row in rows}
            return {c: by_prefix[c[:ID_CHARS]] for c in ids}

        await until(pilot, lambda: all(t.endswith("· " + ls_ages(real_time.time())[c]) for c, t in tags().items()),
                    "the ages as drawn")
        later = start + 185  # three minutes on: "just now" is "3m ago", "25m ago" is "28m ago"
        app.chat.query_one(ConversationList).clock = lambda: later
        expected = ls_ages(later)
        assert sorted(expected.values()) == ["28m ago", "3m ago"]
        await until(pilot, lambda: all(t.endswith("· " + expected[c]) for c, t in tags().items()),
                    f"the sidebar to say {expected}")
