"""Switching the chat's model without leaving the app (palette "Switch model").

Owns: `ModelSwitch`, mixed into `ChatScreen`: the choice of model (the registered models
that are on this machine), the switch itself in the engine worker (every live session is
saved as at quit, the new model loads, a controller for it takes over the same
conversation store) and the screen afterwards: the open chats' panes go, and the chat that
was on screen reopens from the store on the new model, which re-prefills its history
(the toast says what that costs). Chats stay in the store whatever model runs.
Leaves the loading to `engine.loader` and the history to the controller.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from textual import work
from textual.message import Message

from ds4tui.errors import error_line
from ds4tui.screens.widgets.choice_dialog import ChoiceDialog
from ds4tui.screens.widgets.status_bar import StatusBar


@dataclass
class ModelSwitched(Message):
    """The controller now runs `spec` (or could not: `error`); `reopen`: the chat to show."""

    spec: str
    reopen: str | None
    error: str | None = None


def switchable_models(current: str) -> list[str]:
    """Registered models pulled on this machine, current first (the seeded tiny test models
    are not offered)."""
    from ds4tui.engine.registry import REGISTRY, is_installed

    names = [name for name, entry in REGISTRY.items()
             if name != current and entry.builder is None and is_installed(entry)]
    return [current] + names


class ModelSwitch:
    """The `ChatScreen` side of "Switch model"."""

    def action_switch_model(self) -> None:
        # With no model loaded (its file was bad) switching is how the app becomes useful.
        if self._model_error is None and not self._model_ready_or_say():
            return
        from ds4tui.chat.controller import ChatController

        if self.controller is not None and not isinstance(self.controller, ChatController):  # a remote engine
            self._toast("The remote server decides the model (--remote-model picks one).", "Model", "warning")
            return
        if self._engine_job:
            self._toast("Wait for the reply to finish (Escape cancels it), then switch.", "Model", "warning")
            return
        current = self.config.model
        names = switchable_models(current)
        if len(names) < 2:
            self._toast("No other model here: `ds4tui models list`, then `ds4tui models pull NAME`.", "Model",
                        "warning")
            return
        choices = [(str(i), name) for i, name in enumerate(names) if name != current]

        def chosen(answer: str | None) -> None:
            if answer is not None and answer.isdigit() and not self._engine_job:
                self._begin_job()
                conv = self._conversation(self._active) if self._active else None
                self.query_one(StatusBar).set_activity(None, f"switching to {names[int(answer)]}…")
                self._switch_model(names[int(answer)], conv.store_id if conv is not None else None)

        self.app.push_screen(ChoiceDialog(f"Switch from {current} to (open chats are saved; the one on "
                                          "screen reopens on the new model):", choices), chosen)

    @work(thread=True, group="engine", description="switch the model")
    def _switch_model(self, spec: str, reopen: str | None) -> None:
        from ds4tui.chat.controller import ChatController
        from ds4tui.engine.loader import load_model
        from ds4tui.engine.model_check import check_model

        old = self.controller
        try:
            # A file that cannot be a model fails here, before the chats of the current one
            # are saved and their sessions freed: it stays as it was, every chat live.
            check_model(spec)
        except Exception as exc:  # EngineError: one line naming the file and why
            self._idle.set()
            self.post_message(ModelSwitched(spec, reopen, error_line(exc)))
            return
        try:
            if old is not None:
                old.shutdown()
            model = load_model(spec)
            config = replace(self.config, model=spec)
            controller = ChatController(model, config, store=old.history.store if old is not None else None)
            controller.warm_up()
        except Exception as exc:  # EngineError (one line) or a loader bug: the old model stays
            self._idle.set()
            self.post_message(ModelSwitched(spec, reopen, str(exc) or type(exc).__name__))
            return
        self.config, self.controller = config, controller
        self._idle.set()
        self.post_message(ModelSwitched(spec, reopen))

    async def _show_switched(self, message: ModelSwitched) -> None:
        self._end_job()
        status = self.query_one(StatusBar)
        status.set_activity(None, "")
        if message.error is not None:
            still = f"still on {self.config.model}" if self.controller is not None else "no model loaded"
            error = message.error if message.spec in message.error else f"{message.spec}: {message.error}"
            self._toast(f"Could not switch: {error} ({still})", "Model", "error")
            return
        from textual.widgets import ContentSwitcher

        switcher = self.query_one(ContentSwitcher)
        for pane in list(switcher.children):
            await pane.remove()
        if self._model_error is not None:  # the start's model had failed: this one replaces it
            self._model_error = None
            self.query_one("#loading").display = False  # the start screen and its failure
        self._active, self._busy = None, None
        status.forget()
        for _key, waiting in self._send_queue.clear():  # their chats are gone from the screen
            waiting.bubble.remove()
        self._opened.clear()
        status.model_name = self.controller.model_name
        status.ctx_total = self.controller.ctx_size()
        self._toast(f"Now on {message.spec}", "Model")
        if message.reopen:
            self._start_resume(message.reopen, how="stored")
        else:
            await self.action_new_chat()
        self._scan_saved()
