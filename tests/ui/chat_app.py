"""The real chat app for Pilot tests: greedy tiny-llama, still cursor, and a message log to wait on.

Tests wait for explicit messages the chat screen posts (EngineEvent,
TurnEnded, Resumed) through `ChatHost.wait_for`, which sleeps on an
asyncio.Event set by the handlers below, never on repeated pauses.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from textual import on
from textual.message import Message

from ds4tui.screens.app import Ds4TuiApp
from ds4tui.chat import events as ev
from ds4tui.config import Config
from ds4tui.chat.controller import ChatController
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.chat_model_switch import ModelSwitched
from ds4tui.screens.widgets.conversation_list import ConversationList
from tests.ui.toasts import KeepsToasts
from tests.ui.waiting import HANG_S

SIZE = (100, 30)


@pytest.fixture(scope="session")
def tiny_llama():
    from ds4tui.engine.loader import load_model

    return load_model("tiny-llama")


def chat_config(model, **values) -> Config:
    return Config(**{"model": model.info.name, "temperature": 0.0, "max_tokens": 8, **values})


class ChatHost(KeepsToasts, Ds4TuiApp):
    """Ds4TuiApp that records the chat screen's messages as they bubble up."""

    def __init__(self, model, *, config: Config | None = None, controller: ChatController | None = None,
                 resume: str | None = None) -> None:
        super().__init__(config or chat_config(model), model=model, controller=controller, resume=resume,
                         cursor_blink=False)
        self.seen: list[Message] = []
        self._news: asyncio.Event | None = None

    @on(ChatScreen.ModelReady)
    @on(ChatScreen.ModelFailed)
    @on(ChatScreen.Starting)
    @on(ChatScreen.EngineEvent)
    @on(ChatScreen.TurnEnded)
    @on(ChatScreen.Resumed)
    @on(ConversationList.Redrawn)
    @on(ModelSwitched)
    def _record(self, message: Message) -> None:
        self.seen.append(message)
        if self._news is not None:
            self._news.set()

    async def wait_for(self, kind: type, predicate=lambda m: True, *, after: int = 0,
                       timeout: float = HANG_S) -> Message:
        """The first recorded message of `kind` (from index `after`) satisfying `predicate`."""
        self._news = self._news or asyncio.Event()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        index = after
        while True:
            for i in range(index, len(self.seen)):
                if isinstance(self.seen[i], kind) and predicate(self.seen[i]):
                    return self.seen[i]
            index = len(self.seen)
            self._news.clear()
            left = deadline - loop.time()
            if left <= 0:
                pytest.fail(f"timed out waiting for {kind.__name__}")
            try:
                await asyncio.wait_for(self._news.wait(), left)
            except TimeoutError:
                pytest.fail(f"timed out waiting for {kind.__name__}")

    def events(self, kind: type) -> list:
        """Controller events of `kind` seen so far."""
        return [m.event for m in self.seen if isinstance(m, ChatScreen.EngineEvent) and isinstance(m.event, kind)]


async def send(pilot, text: str) -> ChatScreen.TurnEnded:
    """Type `text`, press Enter, wait until the turn has ended."""
    app: ChatHost = pilot.app
    mark = len(app.seen)
    await app.wait_for(ChatScreen.ModelReady)
    prompt = app.chat.query_one("#prompt")
    prompt.focus()
    prompt.insert(text)
    await pilot.press("enter")
    return await app.wait_for(ChatScreen.TurnEnded, after=mark)


class GatedController(ChatController):
    """Parks the worker after the first prefill chunk until `gate` is set (a slow prefill, on demand)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def send(self, key, text, on_event=lambda e: None):
        def gated(event):
            on_event(event)
            if isinstance(event, ev.PrefillProgress) and event.done < event.total:
                # Released by the test, or by a cancel (Escape, or the app closing).
                while not self.gate.wait(0.02) and not self._stop.is_set():
                    pass

        return super().send(key, text, gated)
