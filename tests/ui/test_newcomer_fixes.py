"""What a newcomer's hour with the real app broke (crashes found by hand in tmux)."""

from __future__ import annotations

from ds4tui.screens.widgets.chat_log import AssistantMessage, UserMessage
from ds4tui.screens.widgets.message_menu import MessageMenu
from tests.ui.chat_app import SIZE, ChatHost, chat_config, send


async def test_a_menu_opened_twice_in_a_row_replaces_the_first_and_does_not_crash(tiny_llama, tmp_path):
    """Two "menu" asks before the first menu is gone (Enter then a right-click, keys arriving in
    one burst) crashed the app with DuplicateIds: the old menu's remove() had not run yet when
    the new one, with the same id, was mounted."""
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv")))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello.")
        log = app.chat._pane(app.chat._active).log
        question, reply = log.query(UserMessage).last(), log.query(AssistantMessage).last()
        reply.focus()
        reply.action_ask("menu")
        reply.action_ask("menu")  # at once, the first menu still mounted
        question.action_ask("menu")  # and one for another message
        await pilot.pause()
        await pilot.pause()
        menus = list(app.chat.query(MessageMenu))
        assert len(menus) == 1 and menus[0].target is question
        assert question.has_class("-menu-open") and not reply.has_class("-menu-open")
        await pilot.press("escape")
        await pilot.pause()
        assert not app.chat.query(MessageMenu) and app.focused is question


async def test_shift_tab_from_the_box_selects_the_last_reply_as_the_keys_say(tiny_llama, tmp_path):
    """F1, the README and a reply's version hint say how to select a message; plain tab from the
    box goes to the chat list first (three presses to reach a message), shift+tab is one."""
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv")))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello.")
        log = app.chat._pane(app.chat._active).log
        await pilot.press("shift+tab")
        assert app.focused is log.query(AssistantMessage).last()
        await pilot.press("enter")
        await pilot.pause()
        assert app.chat.query_one(MessageMenu).target is log.query(AssistantMessage).last()
    from ds4tui.screens.keys_help import keys_table

    assert "shift+tab" in "".join(str(c) for c in keys_table().columns[0]._cells)


async def test_the_arrows_move_between_a_confirmation_s_buttons():
    """Focus starts on "No"; Right then Enter chose No before (only Tab reached "Delete")."""
    from textual.app import App

    from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog

    answers: list[bool] = []

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(ConfirmDialog("Delete it?", yes_label="Delete"), answers.append)

    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.focused is not None and app.focused.id == "no"
        await pilot.press("right")
        assert app.focused.id == "yes"
        await pilot.press("left")
        assert app.focused.id == "no"
        await pilot.press("right", "enter")
        await pilot.pause()
    assert answers == [True]


async def test_a_start_step_s_detail_ends_in_an_ellipsis_when_cut_at_80_columns():
    from textual.app import App

    from ds4tui.chat.startup import StartStep
    from ds4tui.screens.widgets.start_progress import StartProgress, StepRow

    class Host(App):
        def compose(self):
            yield StartProgress("smollm2-135m-instruct")

    app = Host()
    async with app.run_test(size=(56, 24)) as pilot:
        panel = app.query_one(StartProgress)
        panel.show_step(StartStep("kernels", "Compile the C kernels (once for this install, about a minute)", 0.33,
                                  "cc, each instruction set, then the dispatch table"))
        await pilot.pause()
        await pilot.pause()
        detail = app.query_one(StepRow).query_one(".step-detail")
        line = "".join(segment.text for segment in detail.render_line(0)).rstrip()
        assert line.endswith("…") and "cc, each" in line
