"""A model that does not load, on screen (Pilot): the app stays up and says why; a message typed
while it loaded comes back into the box instead of waiting for ever; a switch to a bad file
keeps the model and the chats that run now."""

from __future__ import annotations

import threading

from ds4tui.config import Config
from ds4tui.engine.errors import WeightsError
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets.start_progress import StartProgress
from ds4tui.screens.widgets.status_bar import StatusBar
from tests.ui.chat_app import SIZE, ChatHost, send
from tests.ui.waiting import until


async def test_a_message_typed_while_the_load_fails_comes_back_to_the_box(tmp_path, monkeypatch):
    release = threading.Event()

    def failing_load(spec, progress=None):
        release.wait(60)
        raise WeightsError(f"{spec}: not a readable GGUF (value type 99 at byte 4242)")

    monkeypatch.setattr("ds4tui.engine.loader.load_model", failing_load)
    bad = tmp_path / "broken.gguf"
    app = ChatHost(None, config=Config(model=str(bad), cache_dir=str(tmp_path / "kv")))
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.chat.query_one("#prompt")
        prompt.focus()
        prompt.insert("What is the capital of France?")
        await pilot.press("enter")
        assert prompt.text == ""  # queued: sent when the model is ready
        release.set()
        failed = await app.wait_for(ChatScreen.ModelFailed)
        assert "broken.gguf" in failed.error
        await pilot.pause()
        assert prompt.text == "What is the capital of France?"  # not lost, not waiting for ever
        status = app.chat.query_one(StatusBar)
        assert status.model_name == "no model" and "queued" not in status.activity
        # The start card says so itself (a toast would cover its title), and shows the failure.
        card = app.chat.query_one(StartProgress)
        assert "not sent" in card.note and not app.toasts
        # Enter again: it stays in the box, and the notice says why and what to do.
        await pilot.press("enter")
        await pilot.pause()
        assert prompt.text == "What is the capital of France?"
        assert "No model is loaded" in card.note and "broken.gguf" in card.note and "Switch model" in card.note


async def test_switching_to_a_bad_file_keeps_the_model_and_its_live_chats(tiny_llama, tmp_path, monkeypatch):
    from ds4tui.screens.chat_model_switch import ModelSwitched
    from ds4tui.screens.widgets.choice_dialog import ChoiceDialog
    from tests.ui.chat_app import chat_config

    fake = tmp_path / "fake.gguf"
    fake.write_text("hello, not a model\n")
    monkeypatch.setattr("ds4tui.screens.chat_model_switch.switchable_models",
                        lambda current: [current, str(fake)])
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv")))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello from the tiny model.")
        controller = app.chat.controller
        conv = controller.get(app.chat._active)
        assert conv.live
        app.chat.action_switch_model()
        await until(pilot, lambda: isinstance(app.screen, ChoiceDialog) and app.screen.query("#choice-1"),
                    "the model choice")
        mark = len(app.seen)
        app.screen.query_one("#choice-1").press()
        switched = await app.wait_for(ModelSwitched, after=mark)
        assert switched.error is not None
        await pilot.pause()
        note = [n.message for n in app.toasts if n.title == "Model"][-1]
        assert f"{fake}: not a GGUF file (no GGUF magic)" in note and "still on tiny-llama" in note
        assert app.chat.controller is controller and conv.live  # nothing was saved away or freed
        turn = await send(pilot, "And again.")
        assert turn.done is not None


async def test_with_no_model_loaded_switch_model_makes_the_app_useful(tiny_llama, tmp_path, monkeypatch):
    """Started on a file that is no model (past the start's check: here the load itself fails),
    the palette's "Switch model" loads another, and the chat then answers."""
    from ds4tui.screens.chat_model_switch import ModelSwitched
    from ds4tui.screens.widgets.choice_dialog import ChoiceDialog

    fake = tmp_path / "fake.gguf"
    fake.write_text("hello, not a model\n")
    monkeypatch.setattr("ds4tui.screens.chat_model_switch.switchable_models",
                        lambda current: [current, "tiny-llama"])
    app = ChatHost(None, config=Config(model=str(fake), cache_dir=str(tmp_path / "kv"), temperature=0.0,
                                       max_tokens=8))
    async with app.run_test(size=SIZE) as pilot:
        failed = await app.wait_for(ChatScreen.ModelFailed)
        assert "fake.gguf: not a GGUF file" in failed.error
        await pilot.pause()
        assert app.chat.query_one(StartProgress).failed and app.chat.query_one("#loading").display
        app.chat.action_switch_model()
        await until(pilot, lambda: isinstance(app.screen, ChoiceDialog) and app.screen.query("#choice-1"),
                    "the model choice")
        mark = len(app.seen)
        app.screen.query_one("#choice-1").press()
        switched = await app.wait_for(ModelSwitched, after=mark)
        assert switched.error is None
        await until(pilot, lambda: app.chat._active is not None, "a new chat")
        assert not app.chat.query_one("#loading").display  # the start screen and its failure are gone
        assert app.chat.query_one(StatusBar).model_name == "tiny-llama"
        prompt = app.chat.query_one("#prompt")
        prompt.insert("Hello?")
        mark = len(app.seen)
        await pilot.press("enter")
        turn = await app.wait_for(ChatScreen.TurnEnded, after=mark)
        assert turn.done is not None
