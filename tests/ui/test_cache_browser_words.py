"""The cache browser in a user's words (issue 34): a chat's checkpoint reads "chat", not ds4's
reason name `agent-session` (kept in the detail pane), and the eviction dry run's titles use the
width of a wide terminal instead of 12 characters."""

from __future__ import annotations

from ds4tui.screens.widgets.eviction_preview import EvictionPreview
from tests.ui import kv_fixtures as fx
from tests.ui.browser_app import BrowserHost, select, until

LONG = "Planning a two-week train trip through Portugal"  # 47 characters


async def _started(pilot, n: int) -> None:
    await until(pilot, lambda: len(pilot.app.shown) == n, f"{n} rows")


async def test_a_chats_checkpoint_is_labelled_chat_and_the_code_kept_in_the_detail(tmp_path):
    shas = fx.fixture_dir(tmp_path)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await _started(pilot, 4)
        table = app.browser.query_one("#browser-table")
        row = table.get_row(shas["titled"])
        reason = row[[str(c.label) for c in table.ordered_columns].index("reason")]
        assert str(reason) == "chat"
        assert "agent-session" not in str(app.browser.query_one("CacheMap").render())
        await select(pilot, shas["titled"])
        fields = str(app.browser.query_one("#detail-fields").render())
        assert "chat (agent-session, 6)" in fields


async def test_the_eviction_dry_run_uses_the_width_for_titles(tmp_path):
    fx.fixture_dir(tmp_path)
    fx.titled_session(tmp_path, title=LONG, created=fx.NOW - 7)
    app = BrowserHost(tmp_path, watch=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await _started(pilot, 5)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, EvictionPreview), "the preview")
        await pilot.pause()
        table = app.screen.query_one("DataTable")
        labels = [str(c.label) for c in table.ordered_columns]
        titles = [str(table.get_row_at(i)[labels.index("title / text")]) for i in range(table.row_count)]
        assert LONG in titles  # whole, not cut at 12 characters
        reasons = {str(table.get_row_at(i)[labels.index("reason")]) for i in range(table.row_count)}
        assert "agent-session" not in reasons
        # and every column is in view at 140 columns
        assert sum(c.get_render_width(table) for c in table.ordered_columns) <= table.scrollable_content_region.width
