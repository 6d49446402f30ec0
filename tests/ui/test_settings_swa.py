"""The settings dialog's SWA policy field: shown from the config, checked, returned in canonical form."""

from __future__ import annotations

from textual.app import App
from textual.widgets import Input, Static

from ds4tui.config import Config
from ds4tui.screens.settings import SettingsScreen


class SettingsApp(App):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config_ = config
        self.results: list = []

    def on_mount(self) -> None:
        self.push_screen(SettingsScreen(self.config_), self.results.append)


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
