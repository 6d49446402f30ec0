"""The settings dialog's SWA policy field: shown from the config, checked, returned in canonical form."""

from __future__ import annotations

from textual.app import App
from textual.widgets import Input, Static

from ds4tui.config import Config
from ds4tui.screens.settings import SettingsScreen


class SettingsApp(App):
    def __init__(self, config: Config, **kwargs) -> None:
        super().__init__()
        self.config_ = config
        self.kwargs = {"sliding_window": True, **kwargs}
        self.results: list = []

    def on_mount(self) -> None:
        self.push_screen(SettingsScreen(self.config_, **self.kwargs), self.results.append)


async def test_swa_policy_field_shows_checks_and_returns_the_policy():
    app = SettingsApp(Config(swa_policy="periodic:4096"))
    async with app.run_test(size=(100, 40)) as pilot:
        field = app.screen.query_one("#set-swa_policy", Input)
        assert field.value == "periodic:4096"
        field.value = "sometimes"
        await pilot.click("#settings-apply")
        assert app.results == []  # refused, the dialog stays
        assert "swa_policy" in str(app.screen.query_one("#settings-error", Static).render())
        field.value = " Zero "
        field.focus()
        await pilot.press("enter")  # Input.Submitted applies too
        await pilot.pause()
    assert app.results == [{"swa_policy": "zero"}]  # only what changed, canonical


async def test_no_swa_field_for_a_model_without_sliding_window_layers():
    app = SettingsApp(Config(temperature=0.7), sliding_window=False)
    async with app.run_test(size=(100, 40)) as pilot:
        assert not app.screen.query("#set-swa_policy")
        app.screen.query_one("#set-temperature", Input).value = "0.5"
        await pilot.click("#settings-apply")
        await pilot.pause()
    assert app.results == [{"temperature": 0.5}]


async def test_the_system_prompt_box_shows_the_default_and_keeps_following_it():
    """Shown when the config sets none; left as shown, the chat keeps the template's default."""
    from textual.widgets import TextArea

    default = "You are a helpful AI assistant named SmolLM"
    app = SettingsApp(Config(), default_system_prompt=default)
    async with app.run_test(size=(100, 40)) as pilot:
        assert app.screen.query_one("#set-system_prompt", TextArea).text == default
        await pilot.click("#settings-apply")
        await pilot.pause()
    assert app.results == [{}]
    app = SettingsApp(Config(), default_system_prompt=default)
    async with app.run_test(size=(100, 40)) as pilot:
        app.screen.query_one("#set-system_prompt", TextArea).text = "Answer in French."
        await pilot.click("#settings-apply")
        await pilot.pause()
    assert app.results == [{"system_prompt": "Answer in French."}]


async def test_buttons_and_error_stay_in_view_at_80x24():
    app = SettingsApp(Config(), default_system_prompt="default prompt")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for selector in ("#settings-apply", "#settings-cancel", "#set-persist"):
            region = app.screen.query_one(selector).region
            assert region.height and region.bottom <= 23, selector  # above the dialog's bottom border
        app.screen.query_one("#set-temperature").value = "x"
        await pilot.click("#settings-apply")
        await pilot.pause()
        for selector in ("#settings-apply", "#settings-cancel", "#set-persist", "#settings-error"):
            region = app.screen.query_one(selector).region
            assert region.height and region.bottom <= 23, selector


def test_the_notice_says_whether_settings_were_saved():
    from ds4tui.screens.chat_dialogs import settings_notice

    assert "not saved" in settings_notice(None)
    assert settings_notice("/x/config.toml") == (
        "Settings applied to this chat and saved as the default for new chats (/x/config.toml).")
