"""The theme as a setting: the config's theme applied at start, the one picked in the palette
("Change theme") written back to the config file, so it survives a restart.

Owns: `ThemeSetting`, held by an app. The write goes through `config_file.update_config_file`
(the user's other keys and comments stay) in a thread worker, and a failure is a toast,
never a crash: the theme still applies for this run.
"""

from __future__ import annotations

from textual.app import App

from ds4tui.config import ConfigError
from ds4tui.config_file import update_config_file
from ds4tui.format.display import one_line


class ThemeSetting:
    """Applies `theme` (a config value, None: Textual's default) to `app` and saves later changes."""

    def __init__(self, app: App, theme: str | None) -> None:
        self._app = app
        self._saved = theme
        if theme is not None:
            if theme in app.available_themes:
                app.theme = theme
            else:
                app.notify(f"The config's theme {one_line(theme, 40)!r} is not one of Textual's themes: the default"
                           " is used (pick one with ctrl+p, Change theme).", title="Theme", severity="warning",
                           markup=False)
        self.saved_to: str | None = None  # the file written by the last save (tests, the toast)
        app.theme_changed_signal.subscribe(app, self._changed)

    def _changed(self, theme) -> None:
        name = theme.name
        if name == self._saved:
            return
        self._saved = name
        self._app.run_worker(lambda: self._save(name), thread=True, group="config", description="save the theme")

    def _save(self, name: str) -> None:
        try:
            self.saved_to = str(update_config_file({"theme": name}))
        except (ConfigError, OSError) as exc:
            self._app.call_from_thread(self._app.notify, f"Theme {name!r} not saved: {exc}", title="Theme",
                                       severity="warning", markup=False, timeout=8)
