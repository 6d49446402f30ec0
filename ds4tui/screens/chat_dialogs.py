"""The chat screen's dialogs: rename a chat, the settings, the cache browser.

Owns: `ChatDialogs`, mixed into `ChatScreen`: the F2/F3/F4 actions, which push
a dialog or screen and apply what it returns (the rename runs in a file worker
and reports through the screen's `EngineEvent` messages).
Leaves to `ChatScreen`: the key bindings, `controller`, `config` and the active
chat; to its other mixins the helpers the actions call (`_refresh_sidebar`:
chat_panes.py, `_call_from_thread`: chat_workers.py).
"""

from __future__ import annotations

from textual import work

from ds4tui.chat import events as ev
from ds4tui.chat.conversation import MAX_TITLE_CHARS
from ds4tui.chat.streaming import EventBatcher


def settings_notice(saved_to: str | None) -> str:
    """What the chat says after the settings dialog: applied, and saved or for this chat only."""
    if saved_to:
        return f"Settings applied to this chat and saved as the default for new chats ({saved_to})."
    return "Settings applied to this chat only, not saved (tick \"Also the default\" to keep them)."


class ChatDialogs:
    """The `ChatScreen` actions that open a dialog or another screen."""

    def action_rename(self) -> None:
        if not self._model_ready_or_say() or self._active is None:
            return
        from ds4tui.screens.widgets.prompt_dialog import PromptDialog

        key = self._active
        conv = self.controller.get(key)

        def done(title: str | None) -> None:
            if title:
                self._rename(key, title)

        self.app.push_screen(PromptDialog("Rename chat:", conv.display_title, max_length=MAX_TITLE_CHARS), done)

    @work(thread=True, group="files", description="rename a chat")
    def _rename(self, key: str, title: str) -> None:
        assert self.controller is not None
        sink = EventBatcher(lambda event: self.post_message(self.EngineEvent(key, event)))
        try:
            self.controller.rename(key, title, sink)
        except Exception as exc:  # a bad title or a file problem: shown, never a traceback
            sink(ev.ChatError("rename", str(exc) or type(exc).__name__))
        sink.flush()
        self._call_from_thread(self._refresh_sidebar)

    def action_settings(self) -> None:
        if not self._model_ready_or_say():
            return
        if self._busy is not None and self._busy == self._active:
            # Applying would fail after the form was filled in, and lose what was typed.
            self.notify("This chat is answering: change its settings after the reply (Escape stops it).",
                        severity="warning", markup=False)
            return
        from ds4tui.screens.settings import SettingsScreen

        from ds4tui.chat.settings import CHAT_KEYS

        key = self._active
        chat = self.controller.chat_settings(key) if key is not None else None

        def done(changes: dict | None) -> None:
            if self.controller is None:
                return
            if dialog.presets != self.controller.config.system_prompts:  # saved in the dialog
                self.controller.update_config(system_prompts=dict(dialog.presets))
                self.config = self.controller.config
            if not changes:
                return
            defaults = changes.pop("_defaults", None)
            if defaults:
                self.controller.update_config(**defaults)
            if "swa_policy" in changes:
                self.controller.update_config(swa_policy=changes.pop("swa_policy"))
            self.config = self.controller.config
            if key is not None and self.controller.find(key) is not None and changes:
                mine = {k: v for k, v in changes.items() if k in CHAT_KEYS or k == "system_prompt"}
                try:
                    self.controller.set_chat_settings(key, **mine)
                except RuntimeError:
                    self.notify("The chat is busy: try again after the reply.", severity="warning", markup=False)
                    return
            self.notify(settings_notice(dialog.saved_to), markup=False)

        # A remote controller (ds4tui --engine) has no local model: no SWA field, no template default.
        sliding = self.controller.has_sliding_window()
        template = getattr(getattr(self.controller, "model", None), "chat", None)
        dialog = SettingsScreen(self.controller.config, chat, sliding_window=sliding,
                                default_system_prompt=getattr(template, "default_system_prompt", None))
        self.app.push_screen(dialog, done)

    def use_system_prompt(self, preset: str) -> None:
        """The palette's "System prompt: NAME": the preset becomes the active chat's system prompt."""
        if not self._model_ready_or_say() or self._active is None:
            return
        text = self.config.system_prompts.get(preset)
        if text is None:
            self._toast(f"No system prompt preset named {preset!r} any more.", "System prompt", "warning")
            return
        try:
            self.controller.set_chat_settings(self._active, system_prompt=text)
        except RuntimeError:
            self.notify("This chat is answering: pick the preset after the reply (Escape stops it).",
                        severity="warning", markup=False)
            return
        self._toast(f"System prompt {preset!r} set for this chat; the next message uses it.", "System prompt")

    def action_cache_browser(self) -> None:
        from ds4tui.screens.cache_browser import CacheBrowserScreen

        if self.controller is None:
            self.app.push_screen(CacheBrowserScreen(self.config.cache_path()))
            return
        store = self.controller.cache_store
        if store is None:  # --no-disk-cache: browse the configured directory all the same
            store = self.config.cache_path()
        open_shas = frozenset(c.saved_sha for c in self.controller.list() if c.saved_sha)
        self.app.push_screen(CacheBrowserScreen(
            store, model=self.controller.model_info, ctx_size=self.controller.ctx_size(),
            prefill_tok_s=self._prefill_tok_s, open_shas=open_shas,
        ))
