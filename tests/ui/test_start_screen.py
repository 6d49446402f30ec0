"""The first start inside the app: the model's download, preparation and load as one screen of
steps, each with a bar and what it is; a failure says why and retries; ctrl+q stops a download."""

from __future__ import annotations

import asyncio

from textual.widgets import Button, ProgressBar

from ds4tui.config import Config
from ds4tui.engine import registry
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets.start_progress import StartProgress, StepRow
from ds4tui.screens.widgets.status_bar import StatusBar
from tests.fake_pull import fake_pulled_model
from tests.ui.chat_app import ChatHost, send
from tests.ui.waiting import HANG_S


def _config(name: str) -> Config:
    return Config(model=name, temperature=0.0, max_tokens=8)


def _text(widget) -> str:
    return str(widget.render())


async def test_first_start_shows_each_step_fails_clearly_and_retries(tmp_path, monkeypatch):
    fake = fake_pulled_model(tmp_path, monkeypatch)
    fake.failures["left"] = 1  # offline the first time
    app = ChatHost(None, config=_config(fake.name))
    async with app.run_test(size=(80, 24)) as pilot:
        failed = await app.wait_for(ChatScreen.ModelFailed)
        panel = app.chat.query_one(StartProgress)
        assert "Could not find a version" in failed.error and panel.failed
        await pilot.pause()
        error = panel.query_one("#start-error")
        assert error.display and "Could not find a version" in _text(error) and "ctrl+q" in _text(error)
        assert "✗ Download" in _text(panel.query_one("#step-download", StepRow).children[0])
        retry = panel.query_one("#start-retry", Button)
        assert retry.display and app.focused is retry

        fake.gate.clear()  # the next download stops half-way until the test lets it go on
        mark = len(app.seen)
        await pilot.press("enter")  # the focused Retry
        await app.wait_for(ChatScreen.Starting, lambda m: m.step.step == "download" and "MB" in m.step.detail
                           and 0 < (m.step.fraction or 0) < 1, after=mark)
        await pilot.pause()
        row = panel.query_one("#step-download", StepRow)
        assert not panel.failed and not panel.query_one("#start-error").display
        assert f"Download {fake.name} from PyPI" in _text(row.children[0])
        bar = row.query_one(ProgressBar)
        assert 0.3 < (bar.percentage or 0) < 0.6  # half the download is 0.43 of the step's bar
        detail = _text(row.query_one(".step-detail"))
        assert "of" in detail and "MB" in detail
        assert app.chat.query_one(StatusBar).model_name.startswith("downloading the model")

        fake.gate.set()
        await app.wait_for(ChatScreen.ModelReady, after=mark)
        await pilot.pause()
        steps = [m.step for m in app.seen[mark:] if isinstance(m, ChatScreen.Starting)]
        assert [s.step for s in steps if s.state == "done"][-1] == "load"
        assert {"download", "convert", "load"} <= {s.step for s in steps}
        assert not app.chat.query_one("#loading").display  # the chat replaces the start screen
        done = await send(pilot, "hello")
        assert done.done is not None and len(fake.calls) == 2


async def test_quitting_during_the_download_stops_it_and_leaves_nothing(tmp_path, monkeypatch):
    fake = fake_pulled_model(tmp_path, monkeypatch)
    fake.gate.clear()
    app = ChatHost(None, config=_config(fake.name))
    async with app.run_test(size=(80, 24)) as pilot:
        await app.wait_for(ChatScreen.Starting, lambda m: m.step.step == "download" and "MB" in m.step.detail)
        await pilot.press("ctrl+q")
    models = registry.paths.models_dir()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_S
    while any(p.name.startswith(".") for p in models.iterdir()) and loop.time() < deadline:
        await asyncio.sleep(0.05)  # the worker sees the cancel and removes its temp dir
    assert not list(models.iterdir())  # no model, no half-download


def _held_load(monkeypatch, model):
    """load_model waits for the returned event, then gives `model`: the start card stays up."""
    import threading

    release = threading.Event()

    def held(spec, progress=None):
        release.wait(HANG_S)
        return model

    monkeypatch.setattr("ds4tui.engine.loader.load_model", held)
    return release


async def test_ctrl_c_while_the_model_loads_takes_the_queued_message_back(tiny_llama, monkeypatch):
    """As Escape does: the message sent while the model loads comes back into the box, the
    card says so, and nothing is sent once the model is ready."""
    from ds4tui.screens.widgets.chat_log import UserMessage

    release = _held_load(monkeypatch, tiny_llama)
    app = ChatHost(None, config=_config("tiny-llama"))
    async with app.run_test(size=(80, 24)) as pilot:
        card = app.chat.query_one(StartProgress)
        prompt = app.chat.query_one("#prompt")
        for key in ("ctrl+c", "escape"):
            prompt.focus()
            prompt.insert("Sent too early")
            await pilot.press("enter")
            assert prompt.text == "" and "queued" in app.chat.query_one(StatusBar).activity
            app.chat._last_interrupt = float("-inf")  # this ctrl+c is a first one
            await pilot.press(key)
            await pilot.pause()
            assert prompt.text == "Sent too early", key
            assert "back in the box" in card.note and "queued" not in app.chat.query_one(StatusBar).activity
            prompt.clear()
        release.set()
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.pause()
        assert not app.chat.query(UserMessage) and not [m for m in app.seen if isinstance(m, ChatScreen.TurnEnded)]


async def test_what_the_app_says_while_it_loads_is_in_the_card_and_covers_nothing(tiny_llama, monkeypatch):
    """A key that needs the model, pressed while it loads: the card says "still loading" under
    its title; no toast at the top right covers that title (80x24 and 140x40)."""
    from textual.widgets._toast import Toast

    for size in ((80, 24), (140, 40)):
        release = _held_load(monkeypatch, tiny_llama)
        app = ChatHost(None, config=_config("tiny-llama"))
        async with app.run_test(size=size) as pilot:
            card = app.chat.query_one(StartProgress)
            app.chat.action_delete_chat()  # the palette's "Delete chat"
            await pilot.pause()
            assert card.note == "The model is still loading."
            note = card.query_one("#start-note")
            assert note.display and note.region.y > card.query_one("#start-title").region.y
            await pilot.pause(0.2)
            title = card.query_one("#start-title").region
            assert not [t for t in app.chat.query(Toast) if t.region.overlaps(title)]
            assert not app.toasts, size
            release.set()
            await app.wait_for(ChatScreen.ModelReady)
