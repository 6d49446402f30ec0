"""Cache browser actions through Pilot: listing, pin/unpin, delete, resume, filter, rename, eviction preview."""

from __future__ import annotations

from ds4tui.format.kvc import EXT_PINNED, OFFSET_EXT_FLAGS
from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog
from ds4tui.screens.widgets.eviction_preview import EvictionPreview
from ds4tui.screens.widgets.kv_format import file_text
from ds4tui.screens.widgets.prompt_dialog import PromptDialog
from ds4tui.screens.widgets.transcript_view import TranscriptView
from tests.ui import kv_fixtures as fx
from tests.ui.browser_app import TEST_MODEL, BrowserHost, select, until

SIZE = (140, 40)


def _pinned_on_disk(directory, sha: str) -> bool:
    return bool((directory / f"{sha}.kv").read_bytes()[OFFSET_EXT_FLAGS] & EXT_PINNED)


async def _started(pilot, n: int) -> None:
    await until(pilot, lambda: len(pilot.app.shown) == n, f"{n} rows")


async def test_lists_every_file_with_its_verdict(tmp_path):
    """All four kinds of file are listed; ds4's ABI-2 file is 'not loadable here', the truncated one corrupt."""
    shas = fx.fixture_dir(tmp_path)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 4)
        entries = app.browser.listing.by_sha
        assert set(app.shown) == set(shas.values())
        assert entries[shas["titled"]].valid and entries[shas["cold"]].valid
        ds4 = entries[shas["ds4"]]
        assert not ds4.corrupt and ds4.error.startswith("not loadable here: payload ABI 2")
        corrupt = entries[shas["corrupt"]]
        assert corrupt.corrupt and "truncated" in corrupt.error
        # Default order: most recently used first.
        assert app.shown[0] == shas["cold"]
        # The file's text reaches the screen escaped: ESC shown as \\e, brackets literal.
        await select(pilot, shas["titled"])
        preview = str(app.browser.query_one("#detail-preview").render())
        assert "\\e[31mred?\\e[0m" in preview and "\x1b" not in preview
        status = str(app.browser.query_one("#detail-status").render())
        assert fx.TITLE in status


async def test_pin_then_unpin(tmp_path):
    """`p` sets ext_flags bit 7 on disk and the row shows it; `p` again clears it."""
    sha = fx.cold_checkpoint(tmp_path)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 1)
        await pilot.press("p")
        await until(pilot, lambda: app.browser.listing.by_sha[sha].pinned, "pinned row")
        assert _pinned_on_disk(tmp_path, sha)
        await pilot.press("p")
        await until(pilot, lambda: not app.browser.listing.by_sha[sha].pinned, "unpinned row")
        assert not _pinned_on_disk(tmp_path, sha)


async def test_delete_after_confirmation(tmp_path):
    """`d` asks first; 'no' keeps the file, 'yes' removes it and the cursor moves to the next row."""
    cold = fx.cold_checkpoint(tmp_path)
    ds4 = fx.ds4_file(tmp_path)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 2)
        await select(pilot, cold)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
        await pilot.press("n")
        await until(pilot, lambda: app.screen is app.browser, "the dialog to close")
        assert (tmp_path / f"{cold}.kv").exists()
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: app.shown == (ds4,), "the row to go")
        assert not (tmp_path / f"{cold}.kv").exists()
        assert app.browser.selected.sha == ds4


async def test_deleting_a_chat_that_is_open_says_it_comes_back(tmp_path):
    """From the chat (F4) the browser knows which sessions are open: deleting one does not close
    the chat, whose next reply saves it again, and the question says so."""
    sha = fx.titled_session(tmp_path)
    app = BrowserHost(tmp_path, watch=False, open_shas=frozenset({sha}))
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 1)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
        assert "This chat is open" in str(app.screen.query_one(".question").render())
        await pilot.press("n")


async def test_delete_pinned_needs_a_second_confirmation(tmp_path):
    """A pinned file survives one 'yes' followed by 'no'; two 'yes' delete it."""
    sha = fx.titled_session(tmp_path, pinned=True)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 1)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the first confirmation")
        first = app.screen
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen is not first,
                    "the second confirmation")
        assert "PINNED" in str(app.screen._question)
        await pilot.press("n")
        await until(pilot, lambda: app.screen is app.browser, "the dialogs to close")
        assert (tmp_path / f"{sha}.kv").exists()
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the first confirmation")
        first = app.screen
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen is not first,
                    "the second confirmation")
        await pilot.press("y")
        await until(pilot, lambda: app.shown == () and app.refreshes, "the table to empty")
        assert not (tmp_path / f"{sha}.kv").exists()


async def test_resume_a_loadable_file_asks_the_app(tmp_path):
    """Enter on a file the current model wrote posts ResumeRequested with its path, SHA and title."""
    sha = fx.titled_session(tmp_path)
    app = BrowserHost(tmp_path, watch=False, model=TEST_MODEL, ctx_size=8192)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 1)
        await pilot.press("enter")
        await until(pilot, lambda: app.resumes, "ResumeRequested")
        (req,) = app.resumes
        assert (req.sha, req.path, req.title) == (sha, str(tmp_path / f"{sha}.kv"), fx.TITLE)


async def test_the_footer_says_enter_resumes_at_80_columns(tmp_path):
    """The table's own (hidden) enter binding kept the footer from ever naming Resume."""
    fx.titled_session(tmp_path)
    app = BrowserHost(tmp_path, watch=False, model=TEST_MODEL, ctx_size=8192)
    async with app.run_test(size=(80, 24)) as pilot:
        await _started(pilot, 1)
        shown = {key: b.binding.description for key, b in app.screen.active_bindings.items() if b.binding.show}
        assert shown.get("enter") == "Resume" and {"p", "d", "escape"} <= set(shown)
        footer = app.screen.query_one("Footer")

        def keys():
            return [k for k in footer.query("FooterKey") if k.region.width]

        await until(pilot, lambda: any("Resume" in str(k.render()) for k in keys()), "Resume in the footer")
        assert max(k.region.right for k in keys()) <= 80


async def test_resume_refused_shows_why_and_the_transcript(tmp_path):
    """Files the model cannot load (ds4's ABI, another fingerprint) open read-only, and nothing is posted."""
    ds4 = fx.ds4_file(tmp_path)
    other = fx.cold_checkpoint(tmp_path, fingerprint=bytes(32))
    app = BrowserHost(tmp_path, watch=False, model=TEST_MODEL, ctx_size=8192)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 2)
        for sha, why in ((ds4, "payload ABI 2"), (other, "another ds4tui-llama model")):
            await select(pilot, sha)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, TranscriptView), "the transcript")
            assert why in app.screen._note
            text = app.screen.query_one("#transcript-text").render()
            # Shown as messages: ds4's system text without the template's markers.
            assert ("You are DeepSeek. Summarize the repository layout." if sha == ds4
                    else "careful code reviewer") in str(text)
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is app.browser, "the transcript to close")
        assert app.resumes == []


async def test_filter_over_titles_and_text(tmp_path):
    """The filter matches titles and the stored text, case-insensitively; clearing it shows all again."""
    shas = fx.fixture_dir(tmp_path)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 4)
        await pilot.press("slash", *"LISBON")
        await until(pilot, lambda: app.shown == (shas["titled"],), "the title match")
        filt = app.browser.query_one("#browser-filter")
        filt.value = "castle"  # only in the session's text, past its title
        await until(pilot, lambda: app.shown == (shas["titled"],), "the text match")
        filt.value = "reviewer"
        await until(pilot, lambda: app.shown == (shas["cold"],), "the cold checkpoint")
        filt.value = ""
        await until(pilot, lambda: len(app.shown) == 4, "all rows")


async def test_rename_a_titled_session(tmp_path):
    """`t` retitles: the file moves to SHA-1(new title || created_at), the old one goes, the cursor follows."""
    created = fx.NOW - 26 * fx.HOUR
    old = fx.titled_session(tmp_path, created=created)
    fx.cold_checkpoint(tmp_path)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 2)
        await select(pilot, old)
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, PromptDialog), "the title prompt")
        app.screen.query_one("Input").value = "Porto instead"
        await pilot.press("enter")
        new = fx.titled_sha(b"Porto instead", created)
        await until(pilot, lambda: new in app.shown and old not in app.shown, "the renamed row")
        assert not (tmp_path / f"{old}.kv").exists()
        entry = app.browser.selected
        assert entry.sha == new and entry.title == "Porto instead" and entry.valid
        assert entry.header.hits == 3 and entry.payload["token_count"] == 64


async def test_eviction_preview_ranks_unpinned_files(tmp_path):
    """`e` shows the eviction order (pinned files never in it); under budget nothing goes now."""
    shas = fx.fixture_dir(tmp_path)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 4)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, EvictionPreview), "the preview")
        plan = app.screen.plan
        order = [e.sha for e in plan.order]
        assert shas["titled"] not in order  # pinned
        assert order[0] == shas["corrupt"]  # corrupt files score 0 and go first
        assert plan.now == frozenset()


async def test_eviction_preview_at_80_columns_keeps_the_mark_and_title_in_view(tmp_path):
    """The "evict" mark came last, after a title as long as it was: off screen at 80 columns."""
    fx.fixture_dir(tmp_path)
    fx.titled_session(tmp_path, title="A very long title for a chat about many things " * 2, created=fx.NOW - 7)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await _started(pilot, 5)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, EvictionPreview), "the preview")
        await pilot.pause()
        table = app.screen.query_one("DataTable")
        labels = [str(c.label) for c in table.ordered_columns]
        assert labels[:3] == ["#", "now", "title / text"]
        in_view = [c for c in table.ordered_columns if str(c.label) in ("#", "now", "title / text", "reason", "size")]
        assert sum(c.get_render_width(table) for c in in_view) <= table.scrollable_content_region.width


def test_file_text_is_never_markup_or_control_codes():
    """Text from a file keeps its newlines, shows ESC and other controls as escapes, and stays literal."""
    t = file_text("[bold]x[/bold]\n\x1b[31mred\r\u202e")
    assert t.plain == "[bold]x[/bold]\n\\e[31mred\\r\\u202e"
    assert not t.spans


def test_browse_command_refuses_a_missing_directory(tmp_path, capsys):
    """`ds4tui browse --dir` on a path that is not a directory fails with one line naming it."""
    from ds4tui.cli import main

    assert main(["browse", "--dir", str(tmp_path / "nope")]) == 1
    assert "nope is not a directory" in capsys.readouterr().err


async def test_toasts_are_sentence_case_like_the_chats(tmp_path):
    """The browser's toasts start with a capital, as the chat's do: a refused rename, a file
    that cannot be resumed (its lower-case status, capitalised in the toast), a pin."""
    shas = fx.fixture_dir(tmp_path)
    app = BrowserHost(tmp_path, model=TEST_MODEL, watch=False)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot, 4)
        await select(pilot, shas["cold"])
        await pilot.press("t")
        await select(pilot, shas["ds4"])
        await pilot.press("enter")
        await until(pilot, lambda: len(app.toasts) == 2, "two toasts")
        await pilot.press("escape")  # the transcript the refused resume opened
        await select(pilot, shas["cold"])
        await pilot.press("p")
        await until(pilot, lambda: len(app.toasts) == 3, "three toasts")
        notes = [n.message for n in app.toasts]
        assert notes[0] == "Only titled sessions have a name to change"
        assert notes[1].startswith("Not loadable here: payload ABI 2")
        assert notes[2].startswith("Pinned ")
        await select(pilot, shas["ds4"])  # ds4's own file: the pin holds against ds4tui only
        await pilot.press("p")
        await until(pilot, lambda: len(app.toasts) == 4, "four toasts")
        assert "against ds4tui only" in app.toasts[3].message
