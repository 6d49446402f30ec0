"""The app keeps the garbage collector off its startup objects: no collections while the model
loads, the objects alive at model-ready frozen out of later collections, given back on exit."""

from __future__ import annotations

import gc
from dataclasses import replace

from ds4tui.screens.chat import ChatScreen
from tests.ui.chat_app import SIZE, ChatHost, chat_config


class LoadingHost(ChatHost):
    """A ChatHost that loads its model by name in the chat's loader worker."""

    def __init__(self, config) -> None:
        super().__init__(None, config=config)


async def test_model_ready_freezes_the_heap_and_exit_gives_it_back(tiny_llama):
    gc.unfreeze()
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE):
        await app.wait_for(ChatScreen.ModelReady)
        await app.workers.wait_for_complete()
        assert gc.get_freeze_count() > 10_000  # Textual's and the model's objects, at least
    assert gc.get_freeze_count() == 0


async def test_the_loader_collects_nothing_and_turns_collection_back_on(tiny_llama, monkeypatch):
    import ds4tui.engine.loader as loader

    enabled_while_loading: list[bool] = []
    real = loader.load_model

    def load(spec, **kw):
        enabled_while_loading.append(gc.isenabled())
        return real(spec, **kw)

    monkeypatch.setattr(loader, "load_model", load)
    app = LoadingHost(chat_config(tiny_llama))
    async with app.run_test(size=SIZE):
        await app.wait_for(ChatScreen.ModelReady)
        await app.workers.wait_for_complete()
        assert enabled_while_loading == [False]
        assert gc.isenabled()
        assert app.chat.controller is not None and app.chat.controller.model_name == tiny_llama.info.name


async def test_a_failed_load_turns_collection_back_on(tiny_llama):
    app = LoadingHost(replace(chat_config(tiny_llama), model="no-such-model"))
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert gc.isenabled()
        assert app.chat.controller is None
