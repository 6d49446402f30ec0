"""Settings that stick (issue 34): the theme picked in the palette survives a restart, the F3
dialog's defaults and presets land in the config file with the user's own lines kept, the
system prompt box selects all on ctrl+a, the "also the default" box is in view at 80x24, and
presets are offered in the palette ("System prompt: NAME") and in the dialog."""

from __future__ import annotations

from textual.widgets import Checkbox, Select, TextArea

from ds4tui import paths
from ds4tui.config import load_config
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.settings import SettingsScreen
from ds4tui.screens.widgets.prompt_dialog import PromptDialog
from tests.ui.chat_app import ChatHost, chat_config
from tests.ui.waiting import until

SMALL = (80, 24)


def _write_config(text: str) -> None:
    path = paths.config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def vars_of(config, *keys) -> dict:
    return {k: getattr(config, k) for k in keys}


async def test_the_theme_picked_in_the_palette_survives_a_restart(tiny_llama):
    _write_config("# mine\nbudget_mb = 512  # small disk\n")
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, **vars_of(load_config(), "budget_mb")))
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        assert app.theme != "nord"
        await pilot.press("ctrl+p")
        await pilot.press(*"Theme")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.3)
        await pilot.press(*"nord")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: app.theme == "nord" and app.theme_setting.saved_to is not None, "the theme saved")
    text = paths.config_path().read_text()
    assert text.startswith("# mine\nbudget_mb = 512  # small disk\n") and 'theme = "nord"' in text
    config = load_config()
    assert config.theme == "nord" and config.budget_mb == 512
    again = ChatHost(tiny_llama, config=chat_config(tiny_llama, theme=config.theme))
    async with again.run_test(size=SMALL) as pilot:
        await again.wait_for(ChatScreen.ModelReady)
        assert again.theme == "nord"


async def test_an_unknown_theme_in_the_config_is_said_and_the_default_kept(tiny_llama):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, theme="no-such-theme"))
    async with app.run_test(size=SMALL):
        await app.wait_for(ChatScreen.ModelReady)
        assert app.theme != "no-such-theme"
        assert any("not one of Textual's themes" in n.message for n in app.toasts)


async def test_the_default_checkbox_is_in_view_at_80x24_and_saving_keeps_the_users_lines(tiny_llama):
    _write_config("# my settings\nmax_tokens = 8  # short\n")
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.press("f3")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, SettingsScreen)
        box = dialog.query_one("#set-persist", Checkbox)
        shown = dialog.query_one("#settings-dialog").region
        # On screen without scrolling: inside the dialog and inside the terminal.
        assert box.region.height >= 1 and shown.contains_region(box.region)
        assert box.region.bottom <= SMALL[1]
        await pilot.click("#set-persist")
        assert box.value
        dialog.query_one("#set-temperature").value = "0.4"
        await pilot.click("#settings-apply")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
    text = paths.config_path().read_text()
    assert text.startswith("# my settings\nmax_tokens = 8  # short\n") and "temperature = 0.4" in text
    assert "top_p" not in text  # left at its default: no line added


async def test_ctrl_a_in_the_system_prompt_box_selects_all_so_typing_replaces_it(tiny_llama):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, system_prompt="Old prompt\nsecond line"))
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.press("f3")
        await pilot.pause()
        area = app.screen.query_one("#set-system_prompt", TextArea)
        area.focus()
        area.move_cursor((1, 3))
        await pilot.press("ctrl+a")
        await pilot.press(*"New")
        assert area.text == "New"
        await pilot.click("#settings-apply")
        await pilot.pause()
        assert app.chat.controller.chat_settings(app.chat._active)["system_prompt"] == "New"


async def test_presets_in_the_palette_and_the_dialog(tiny_llama):
    """A preset in the config is "System prompt: NAME" in the palette (typing "sys" finds it)
    and applies to the active chat; the dialog saves the prompt as a new preset, which the
    config file keeps and the palette offers at once."""
    _write_config('# presets\n[system_prompts]\nterse = "Answer in one sentence."\n')
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, system_prompts=load_config().system_prompts))
    async with app.run_test(size=SMALL) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.press("ctrl+p")
        await pilot.press(*"sys")
        await pilot.pause(0.3)
        palette = app.screen
        listed = [str(option.prompt) for option in palette.query("CommandList").first().options]
        assert any("System prompt: terse" in line for line in listed), listed
        await pilot.press(*" pro")
        await pilot.press(*": ters")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen)
                    and app.chat.controller.chat_settings(app.chat._active)["system_prompt"]
                    == "Answer in one sentence.", "the preset applied")

        await pilot.press("f3")
        await pilot.pause()
        dialog = app.screen
        select = dialog.query_one("#set-preset", Select)
        assert [value for _, value in select._options if isinstance(value, str)] == ["terse"]
        area = dialog.query_one("#set-system_prompt", TextArea)
        area.text = "You review code: bugs first."
        await pilot.click("#settings-save-preset")
        await until(pilot, lambda: isinstance(app.screen, PromptDialog), "the name dialog")
        await pilot.press(*"code review", "enter")
        await until(pilot, lambda: app.screen is dialog and "code review" in dialog.presets, "the preset saved")
        select.value = "terse"
        await pilot.pause()
        assert area.text == "Answer in one sentence."  # picking a preset fills the box
        # A preset can go again: "Delete" removes the one picked, from the file too.
        dialog.presets["gone"] = "x"
        select.set_options(dialog._preset_options())
        from ds4tui.config_file import update_config_file

        update_config_file(tables={"system_prompts": {"gone": "x"}})
        select.value = "gone"
        await pilot.pause()
        await pilot.click("#settings-delete-preset")
        await until(pilot, lambda: "gone" not in dialog.presets, "the preset deleted")
        assert "gone" not in load_config().system_prompts
        await pilot.press("escape")
        await pilot.pause()
        assert app.chat.config.system_prompts["code review"] == "You review code: bugs first."
        await pilot.press("ctrl+p")
        await pilot.press(*"System prompt: code")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: app.chat.controller.chat_settings(app.chat._active)["system_prompt"]
                    == "You review code: bugs first.", "the new preset applied")
    text = paths.config_path().read_text()
    assert text.startswith('# presets\n[system_prompts]\nterse = "Answer in one sentence."\n')
    assert load_config().system_prompts == {"terse": "Answer in one sentence.",
                                            "code review": "You review code: bugs first."}


async def test_the_cache_browser_app_takes_the_theme_too(tmp_path):
    from ds4tui.screens.browse_app import BrowseApp

    app = BrowseApp(tmp_path, theme="nord")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        assert app.theme == "nord"
        app.theme = "gruvbox"
        await until(pilot, lambda: app.theme_setting.saved_to is not None, "the theme saved")
    assert load_config().theme == "gruvbox"
