"""The chat at 80x24, the size the README promises: what must stay whole on screen."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Checkbox, Label

from ds4tui.chat import events as ev
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.chat_moves import EDITING
from ds4tui.screens.keys_help import CHAT_KEYS, KeysHelpScreen
from ds4tui.screens.widgets.conversation_list import ChatItem, ConversationList
from ds4tui.screens.widgets.prefill_bar import PrefillBar
from ds4tui.screens.widgets.status_bar import StatusBar
from tests.ui.chat_app import ChatHost, GatedController, chat_config, send

SMALL = (80, 24)


async def test_the_prefill_numbers_fit_at_80_columns_with_the_sidebar_open(tiny_llama):
    """Tokens done/total, speed and ETA are what a user watches; the bar gives way to them."""
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        assert app.chat.query_one("#sidebar").display
        app.chat.query_one("#prompt").insert("Summarize: " + "word " * 420)
        await pilot.press("enter")
        await app.wait_for(ChatScreen.EngineEvent, lambda m: isinstance(m.event, ev.PrefillProgress))
        await pilot.pause()
        bar = app.chat.query_one("#chats").visible_content.query_one(PrefillBar)
        info = bar.query_one("#prefill-info")
        text = Text(str(info.render()))
        assert "tok/s · ETA" in text.plain
        assert info.content_region.width >= text.cell_len  # nothing of it cut
        assert info.region.right <= bar.content_region.right
        assert bar.query_one("Bar").region.width >= 3  # and the bar itself still shows
        controller.gate.set()


async def test_a_fork_of_a_long_title_stays_apart_from_its_parent_in_the_sidebar(tiny_llama, tmp_path):
    """"title (fork)" cut at its end read exactly like the parent's row at 80 columns."""
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    async with app.run_test(size=SMALL) as pilot:
        await send(pilot, "What is the capital of France? Answer in one sentence, please.")
        mark = len(app.seen)
        app.chat.action_fork_chat()
        await app.wait_for(ConversationList.Redrawn, lambda m: len(m.entries) == 2, after=mark)
        await pilot.pause()
        rows = []
        for item in app.chat.query(ChatItem):
            title, tag = item.query_one(".title", Label), item.query_one(".tag", Label)
            assert title.region.right <= tag.region.x and tag.region.right <= item.region.right
            rows.append((str(title.render()), str(tag.render())))
        assert rows[0][1] == "" and rows[1][1] == " (fork)"
        assert rows[0][0].startswith("● What is the capital") and rows[1][0].startswith("● What is the capital")


def test_the_status_line_drops_the_meter_before_cutting_what_the_engine_does():
    status = StatusBar()
    status.model_name, status.ctx_used, status.ctx_total = "smollm2-135m-instruct", 56, 4096
    status.activity = EDITING
    wide = status.line(138)
    assert "▰" in wide and wide.endswith(EDITING)
    narrow = status.line(78)  # 80 columns less the bar's padding
    assert "▰" not in narrow and "ctx 56/4,096" in narrow and narrow.endswith(EDITING) and len(narrow) <= 78


async def test_the_settings_checkbox_label_is_whole(tiny_llama):
    """The dialog is 64 columns wide at any terminal size; its checkbox label used to lose its end."""
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.press("f3")
        await pilot.pause()
        box = app.screen.query_one("#set-persist", Checkbox)
        label = str(box.label)
        assert "new chats" in label
        dialog = app.screen.query_one("#settings-dialog")
        assert box.region.right <= dialog.content_region.right  # not cut by the dialog's edge


async def test_the_chat_list_comes_back_when_a_narrow_terminal_is_widened(tiny_llama):
    """Below 60 columns the list folds away; a terminal resized back used to keep it hidden.
    Once ctrl+b is pressed, the user's choice holds whatever the width."""
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        sidebar = app.chat.query_one("#sidebar")
        await pilot.resize_terminal(50, 20)
        await pilot.pause()
        assert not sidebar.display
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert sidebar.display
        await pilot.press("ctrl+b")
        await pilot.resize_terminal(50, 20)
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert not sidebar.display


def _listed_keys() -> set[str]:
    """CHAT_KEYS' labels as binding names: "ctrl+pageup/down" -> ctrl+pageup, ctrl+pagedown."""
    out = set()
    for label, _ in CHAT_KEYS:
        first, *rest = label.lower().split("/")
        out.add(first)
        out.update(first.rsplit("up", 1)[0] + r for r in rest)
    return out


async def test_f1_shows_every_chat_key_at_80x24(tiny_llama):
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        assert "F1 keys" in app.chat.query_one("#prompt").placeholder
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, KeysHelpScreen)
        box = app.screen.query_one("VerticalScroll")
        assert box.region.height <= SMALL[1] and box.max_scroll_y == 0  # all of it, no scrolling
        bound = {b.key for b in ChatScreen.BINDINGS} | {"ctrl+q"}
        assert bound <= _listed_keys()  # a new binding needs its line
        await pilot.press("escape")
        assert not isinstance(app.screen, KeysHelpScreen)


def test_each_key_line_fits_one_row_of_the_f1_box():
    from ds4tui.screens.keys_help import CHAT_KEYS

    from ds4tui.screens.keys_help import MARKERS
    from ds4tui.screens.widgets import conversation_list as cl

    key_width = max(len(k) for k, _ in CHAT_KEYS)
    assert all(key_width + 2 + len(what) <= 78 - 4 for _, what in CHAT_KEYS)  # border and padding
    assert len(MARKERS) <= 78 - 4 and all(m in MARKERS for m in (cl.LIVE, cl.PARKED, cl.SAVED, cl.BUSY, cl.TEXT_ONLY))
