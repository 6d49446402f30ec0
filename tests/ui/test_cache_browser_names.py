"""The browser names every file: checkpoints after their chat, or by their first user message;
Enter on a chat's checkpoint offers that chat; `v` shows messages (r: raw); Escape clears the filter."""

from __future__ import annotations

from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog
from ds4tui.screens.widgets.transcript_view import TranscriptView
from tests.ui import kv_fixtures as fx
from tests.ui.browser_app import TEST_MODEL, BrowserHost, select, until

SIZE = (140, 40)
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
# The titled session's text up to its user turn: an `evict` checkpoint of that chat.
PART = SYSTEM + "<|im_start|>user\nPlan three days in Lisbon. \x1b[31mred?\x1b[0m<|im_end|>\n"
LONE = SYSTEM + "<|im_start|>user\nWhat is a monad?<|im_end|>\n<|im_start|>assistant\nA monoid"


async def _names(tmp_path, **kwargs):
    titled = fx.titled_session(tmp_path)
    part = fx.cold_checkpoint(tmp_path, PART)
    lone = fx.cold_checkpoint(tmp_path, LONE)
    system = fx.cold_checkpoint(tmp_path, SYSTEM)
    fx.titled_session(tmp_path, title="Second chat", created=fx.NOW - 3 * fx.HOUR,
                      text=SYSTEM + "<|im_start|>user\nHi<|im_end|>\n")
    return BrowserHost(tmp_path, watch=False, **kwargs), titled, part, lone, system


async def test_every_row_is_named(tmp_path):
    app, titled, part, lone, system = await _names(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(app.shown) == 5, "five rows")
        name = app.browser.name_of
        by = app.browser.listing.by_sha
        assert name(by[titled]).text == fx.TITLE
        assert (name(by[part]).kind, name(by[part]).chat_sha) == ("chat", titled)
        assert name(by[part]).text == "↳ " + fx.TITLE
        assert (name(by[lone]).kind, name(by[lone]).text) == ("message", "What is a monad?")
        # The system prompt starts both titled chats: it belongs to neither.
        assert name(by[system]).kind == "shared" and name(by[system]).text.startswith("start of 2 chats")
        # Nothing reads like the template's first line any more.
        assert not any(n.text.startswith("<|im_start|>") for n in app.browser.listing.names.values())


async def test_enter_on_a_chats_checkpoint_offers_that_chat(tmp_path):
    app, titled, part, _, _ = await _names(tmp_path, model=TEST_MODEL, ctx_size=8192)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(app.shown) == 5, "five rows")
        await select(pilot, part)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the offer")
        assert "belongs to the chat" in str(app.screen._question) and "Trip to Lisbon" in str(app.screen._question)
        await pilot.press("y")
        await until(pilot, lambda: app.resumes, "ResumeRequested")
        assert [r.sha for r in app.resumes] == [titled]


async def test_v_shows_messages_and_r_the_raw_text(tmp_path):
    app, titled, *_ = await _names(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(app.shown) == 5, "five rows")
        await select(pilot, titled)
        await pilot.press("v")
        await until(pilot, lambda: isinstance(app.screen, TranscriptView), "the transcript")
        shown = str(app.screen.query_one("#transcript-text").render())
        assert "<|im_start|>" not in shown
        assert "user\nPlan three days in Lisbon. \\e[31mred?\\e[0m" in shown
        assert "assistant\nDay 1: Alfama and the castle." in shown
        await pilot.press("r")
        raw = str(app.screen.query_one("#transcript-text").render())
        assert raw.startswith("<|im_start|>system\n")
        await pilot.press("r")
        assert "<|im_start|>" not in str(app.screen.query_one("#transcript-text").render())


async def test_escape_clears_the_filter(tmp_path):
    app, titled, part, *_ = await _names(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(app.shown) == 5, "five rows")
        await pilot.press("slash", *"lisbon")
        # The chat's checkpoint matches by the name it is shown under.
        await until(pilot, lambda: set(app.shown) == {titled, part}, "the filtered rows")
        await pilot.press("escape")
        await until(pilot, lambda: len(app.shown) == 5, "all rows again")
        assert app.browser.query_one("#browser-filter").value == ""
        assert app.screen is app.browser  # the first Escape only cleared the filter


async def test_delete_names_the_chat(tmp_path):
    app, titled, part, *_ = await _names(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(app.shown) == 5, "five rows")
        for sha, words in ((titled, "Delete the .kv file of the chat Trip to Lisbon"),
                           (part, "checkpoint of the chat Trip to Lisbon")):
            await select(pilot, sha)
            await pilot.press("d")
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
            assert words in str(app.screen._question)
            await pilot.press("n")
            await until(pilot, lambda: app.screen is app.browser, "the dialog to close")


def test_a_file_that_is_not_kvc_still_has_a_name(tmp_path):
    """300 random bytes under a cache-file name: the row said nothing at all in the title column."""
    from ds4tui.cache.entry import inspect_file
    from ds4tui.chat.file_names import name_of

    path = tmp_path / ("b" * 40 + ".kv")
    path.write_bytes(bytes(range(256)) + bytes(44))
    assert name_of(inspect_file(str(path)), None, None).text == "unreadable file bbbbbbbbbbbb"
