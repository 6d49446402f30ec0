"""The settings dialog: temperature, top-p, min-p, max tokens, the system prompt and the SWA policy.

Owns: the form and checking each value with `config.check_value` (the same
rules as the config file), the system prompt presets (pick one, save the prompt as
one: `[system_prompts]` in the config file), and optionally writing the values to the
config file (`config_file.update_config_file`: in place, the user's other lines kept).
Leaves to the chat screen: applying the result to the controller.
"""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, TextArea

from ds4tui.config import MAX_PRESET_NAME, Config, ConfigError, check_preset_name, check_value, load_config
from ds4tui.config_file import saved_changes, update_config_file
from ds4tui.format.display import one_line
from ds4tui.format.swa_policy import parse_policy

NUMBER_FIELDS = (
    ("temperature", "Temperature (0 = greedy)"),
    ("top_p", "Top-p"),
    ("min_p", "Min-p"),
    ("max_tokens", "Max tokens per reply"),
)


class PromptBox(TextArea):
    """The system prompt's box: ctrl+a selects the whole prompt (typing then replaces it),
    as in a browser's text box; home still goes to the line's start."""

    BINDINGS = [Binding("ctrl+a", "select_all", "Select all", show=False)]


class SettingsScreen(ModalScreen[dict | None]):
    """Dismisses with the changed settings ({key: value}), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    """
    | Key | Description |
    | :- | :- |
    | escape | Close without changing anything. |
    """

    def __init__(self, config: Config, chat: dict | None = None, *, sliding_window: bool = False,
                 default_system_prompt: str | None = None) -> None:
        """
        Args:
            config: the settings shown.
            chat: the active chat's own values (ChatController.chat_settings); the form then
                edits that chat, and the config file only when "save" is ticked.
            sliding_window: the model has sliding-window layers, so the SWA storage policy
                applies (else the field is not shown: every policy stores the same bytes).
            default_system_prompt: the chat template's own, shown when none is set.
        """
        super().__init__()
        self._config = replace(config, **{k: v for k, v in (chat or {}).items() if hasattr(config, k)})
        self._for_chat = chat is not None
        self._sliding_window = sliding_window
        self._default_prompt = default_system_prompt or ""
        self.saved_to: str | None = None  # the config file written, when "save" was ticked
        # The presets as the config file now holds them (the dialog may add one): the chat
        # screen hands them to the controller when the dialog closes, applied or not.
        self.presets: dict[str, str] = dict(config.system_prompts)

    def compose(self) -> ComposeResult:
        # The form scrolls; the error line and the buttons stay below it, always in view
        # (at 80x24 the whole form does not fit).
        with Vertical(id="settings-dialog", classes="dialog"):
            yield Label(Text("Settings of this chat" if self._for_chat else "Settings"), classes="dialog-title")
            with VerticalScroll(id="settings-form"):
                for key, label in NUMBER_FIELDS:
                    with Horizontal(classes="field"):
                        yield Label(Text(label), classes="field-label")
                        yield Input(value=str(getattr(self._config, key)), id=f"set-{key}", classes="field-input")
                if self._sliding_window:
                    with Horizontal(classes="field"):
                        yield Label(Text("SWA policy of checkpoints"), classes="field-label")
                        yield Input(value=self._config.swa_policy, placeholder="full | periodic:K | zero",
                                    id="set-swa_policy", classes="field-input")
                default = " (the model's default shown)" if self._default_prompt and not self._config.system_prompt else ""
                yield Label(Text(("System prompt of this chat" if self._for_chat else "System prompt for new chats")
                                 + default), classes="dialog-label")
                yield PromptBox(self._config.system_prompt or self._default_prompt, id="set-system_prompt",
                                soft_wrap=True)
                with Horizontal(classes="field", id="preset-row"):
                    yield Select(self._preset_options(), prompt="Preset…", id="set-preset", compact=True)
                    yield Button("Save as preset", id="settings-save-preset", compact=True)
                    yield Button("Delete", id="settings-delete-preset", compact=True)
            # Outside the scrolling form: in view at 80x24 with no scrolling.
            yield Checkbox("Also the default for new chats (config file)", id="set-persist", compact=True)
            yield Static("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="settings-apply", compact=True)
                yield Button("Cancel", id="settings-cancel", compact=True)

    # Rows of the dialog outside the form: border, padding, title, checkbox, buttons (the error
    # line shows only with an error). At 80x24 the whole form then fits, SWA field aside.
    CHROME_ROWS = 8

    def _preset_options(self) -> list[tuple[str, str]]:
        return [(one_line(name, 40), name) for name in sorted(self.presets, key=str.casefold)]

    @on(Select.Changed, "#set-preset")
    def _preset_chosen(self, event: Select.Changed) -> None:
        if isinstance(event.value, str) and event.value in self.presets:
            box = self.query_one("#set-system_prompt", TextArea)
            box.text = self.presets[event.value]
            box.focus()

    @on(Button.Pressed, "#settings-save-preset")
    def _ask_preset_name(self) -> None:
        from ds4tui.screens.widgets.prompt_dialog import PromptDialog

        text = self.query_one("#set-system_prompt", TextArea).text
        if not text.strip():
            self._error("The system prompt is empty: nothing to save as a preset.")
            return
        chosen = self.query_one("#set-preset", Select).value
        self.app.push_screen(PromptDialog("Save the system prompt as the preset named:",
                                          chosen if isinstance(chosen, str) else "",
                                          max_length=MAX_PRESET_NAME),
                             lambda name: self._save_preset(name, text))

    def _save_preset(self, name: str | None, text: str) -> None:
        if name is None:
            return
        name = name.strip()
        problem = check_preset_name(name)
        if problem:
            self._error(problem)
            return
        try:
            path = update_config_file(tables={"system_prompts": {name: text}})
        except (ConfigError, OSError) as exc:
            self._error(f"preset not saved: {exc}")
            return
        self.presets[name] = text
        select = self.query_one("#set-preset", Select)
        select.set_options(self._preset_options())
        select.value = name
        self._error("")
        self.notify(f"Preset {name!r} saved in {path}; ctrl+p \"System prompt: {name}\" applies it.",
                    markup=False)

    @on(Button.Pressed, "#settings-delete-preset")
    def _delete_preset(self) -> None:
        select = self.query_one("#set-preset", Select)
        name = select.value
        if not isinstance(name, str) or name not in self.presets:
            self._error("Pick the preset to delete in the list first.")
            return
        try:
            update_config_file(tables={"system_prompts": {name: None}})
        except (ConfigError, OSError) as exc:
            self._error(f"preset not deleted: {exc}")
            return
        del self.presets[name]
        select.set_options(self._preset_options())  # the box keeps its text
        self._error("")
        self.notify(f"Preset {name!r} deleted from the config file.", markup=False)

    def _error(self, text: str) -> None:
        line = self.query_one("#settings-error", Static)
        line.update(Text(text))
        line.display = bool(text)
        self._fit_form()

    def on_mount(self) -> None:
        self.query_one("#set-temperature", Input).focus()
        self._fit_form()

    def on_resize(self) -> None:
        self._fit_form()

    def _fit_form(self) -> None:
        # CSS has no "auto height, shrink to what is left" for one child of an auto-height box.
        error = self.query_one("#settings-error", Static)
        text = str(error.render()) if error.display else ""
        width = max(10, self.query_one("#settings-dialog").content_region.width)
        error_rows = -(-len(text) // width) if text else 0
        self.query_one("#settings-form").styles.max_height = max(4, self.size.height - self.CHROME_ROWS - error_rows)

    def _values(self) -> dict:
        """The form's values, checked; raises ConfigError naming the bad field."""
        out: dict = {}
        for key, _ in NUMBER_FIELDS:
            raw = self.query_one(f"#set-{key}", Input).value.strip()
            try:
                value = int(raw) if key == "max_tokens" else float(raw)
            except ValueError:
                raise ConfigError(f"{key}: {raw!r} is not a number") from None
            out[key] = check_value(key, value, "settings")
        if self._sliding_window:
            raw = self.query_one("#set-swa_policy", Input).value
            out["swa_policy"] = str(parse_policy(check_value("swa_policy", raw, "settings")))  # canonical text
        prompt = self.query_one("#set-system_prompt", TextArea).text
        # Empty, or the default left as shown: keep following the template's default.
        out["system_prompt"] = prompt if prompt.strip() and prompt != self._default_prompt else None
        return out

    @on(Button.Pressed, "#settings-apply")
    @on(Input.Submitted)
    def _apply(self) -> None:
        try:
            values = self._values()
        except ConfigError as exc:
            self._error(str(exc))
            return
        if self.query_one("#set-persist", Checkbox).value:
            try:
                path = update_config_file(saved_changes(load_config(), values))
            except (ConfigError, OSError) as exc:
                self._error(f"not saved: {exc}")
                return
            self.saved_to = str(path)
        changes = {k: v for k, v in values.items() if getattr(self._config, k) != v}
        if self.query_one("#set-persist", Checkbox).value:
            changes["_defaults"] = values  # new chats take these too
        self.dismiss(changes)

    @on(Button.Pressed, "#settings-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
