"""The settings dialog: temperature, top-p, min-p, max tokens, the system prompt and the SWA policy.

Owns: the form and checking each value with `config.check_value` (the same
rules as the config file), and optionally writing them to the config file.
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
from textual.widgets import Button, Checkbox, Input, Label, Static, TextArea

from ds4tui.config import Config, ConfigError, check_value, load_config, save_config
from ds4tui.format.swa_policy import parse_policy

NUMBER_FIELDS = (
    ("temperature", "Temperature (0 = greedy)"),
    ("top_p", "Top-p"),
    ("min_p", "Min-p"),
    ("max_tokens", "Max tokens per reply"),
)


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
                yield TextArea(self._config.system_prompt or self._default_prompt, id="set-system_prompt",
                               soft_wrap=True)
                yield Checkbox("Also the default for new chats (config file)", id="set-persist")
            yield Static("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="settings-apply")
                yield Button("Cancel", id="settings-cancel")

    # Rows of the dialog outside the form: border, padding, title, error line, buttons.
    CHROME_ROWS = 11

    def on_mount(self) -> None:
        self.query_one("#set-temperature", Input).focus()
        self._fit_form()

    def on_resize(self) -> None:
        self._fit_form()

    def _fit_form(self) -> None:
        # CSS has no "auto height, shrink to what is left" for one child of an auto-height box.
        self.query_one("#settings-form").styles.max_height = max(4, self.size.height - self.CHROME_ROWS)

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
            self.query_one("#settings-error", Static).update(Text(str(exc)))
            return
        if self.query_one("#set-persist", Checkbox).value:
            try:
                file_config = load_config()
                path = save_config(replace(file_config, **values))
            except (ConfigError, OSError) as exc:
                self.query_one("#settings-error", Static).update(Text(f"not saved: {exc}"))
                return
            self.saved_to = str(path)
        changes = {k: v for k, v in values.items() if getattr(self._config, k) != v}
        if self.query_one("#set-persist", Checkbox).value:
            changes["_defaults"] = values  # new chats take these too
        self.dismiss(changes)

    @on(Button.Pressed, "#settings-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
