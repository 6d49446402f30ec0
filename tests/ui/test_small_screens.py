"""What keeps the browser usable at 80 columns: the columns kept, the header's numbers, the hex
dump's rows, the picture of the cache (pure functions, no terminal needed)."""

from __future__ import annotations

from ds4tui.cache.entry import inspect_file
from ds4tui.format.display import relative_time, score_text
from ds4tui.screens.widgets.budget_gauge import BudgetGauge
from ds4tui.screens.widgets.cache_map import by_kind, by_reason, stacked_bar
from ds4tui.screens.widgets.kv_detail import hex_dump
from ds4tui.screens.widgets.kv_table import COLUMN_KEYS, fit_columns
from ds4tui.screens.widgets.title_fit import fitted_title, split_tag
from tests.ui import kv_fixtures as fx


def test_columns_drop_by_priority_keeping_title_reason_status_and_pin():
    keys, widths = fit_columns(80)
    assert {"title", "reason", "status", "pinned"} <= set(keys)
    assert sum(widths[k] + 2 for k in keys) <= 80 - 2  # cells + padding + scrollbar
    wide, wide_widths = fit_columns(140)
    assert {"size", "score", "hits", "tokens", "last_used"} <= set(wide)
    assert wide_widths["title"] >= 40  # titles were cut at 18 characters at 140 columns
    assert fit_columns(200)[0] == COLUMN_KEYS  # room for every column


def test_the_header_keeps_the_pinned_count_when_narrow():
    gauge = BudgetGauge()
    gauge.set_usage(used_bytes=5 << 20, budget_bytes=4 << 30, file_count=12, pinned_count=2)
    wide = gauge.render().plain
    gauge.narrow = True
    narrow = gauge.render().plain
    assert narrow.endswith("12 files · 2 pinned") and len(narrow) < len(wide) and len(narrow) <= 50


def test_hex_dump_rewraps_at_8_bytes_a_row():
    raw = bytes(range(52))
    rows = hex_dump(raw, 8).plain.splitlines()
    assert len(rows) == 7 and rows[1].startswith("0008  08 09")
    assert all(len(r) <= 6 + 8 * 3 for r in rows)
    assert len(hex_dump(raw).plain.splitlines()) == 4


def test_cache_map_splits_by_kind_and_reason(tmp_path):
    shas = fx.fixture_dir(tmp_path)
    entries = [inspect_file(tmp_path / f"{sha}.kv") for sha in shas.values()]
    kinds = {s.label: s.bytes for s in by_kind(entries)}
    size = {k: (tmp_path / f"{sha}.kv").stat().st_size for k, sha in shas.items()}
    assert kinds == {"pinned": size["titled"], "anonymous": size["cold"] + size["ds4"], "damaged": size["corrupt"]}
    reasons = by_reason(entries)
    assert sum(s.bytes for s in reasons) == sum(size.values())
    assert [s.bytes for s in reasons] == sorted((s.bytes for s in reasons), reverse=True)
    bar = stacked_bar(by_kind(entries), 4 * sum(size.values()), 20).plain
    assert len(bar) == 20 and bar.count("░") >= 10  # a quarter used: the rest is free room


def test_scores_and_ages_read_plainly():
    assert score_text(2.16e-05) == "22.6" and score_text(4.33e-05) == "45.4"
    assert "e" not in score_text(1e-9) and score_text(0) == "0"
    now = 1_000_000
    assert relative_time(now - 30, now) == relative_time(now - 59, now) == "just now"
    assert relative_time(now - 60, now) == "1m ago"  # never "0m ago"


def test_a_cut_title_keeps_its_fork_tag():
    """The browser's title column and the sidebar cut the body, not the tag that tells a fork
    from its parent; cell widths count (CJK takes two)."""
    parent = "What is the capital of France? Answer in one se…"
    assert fitted_title(parent + " (fork)", 22).plain == "What is the ca… (fork)"
    assert fitted_title(parent + " (fork 2)", 22).plain.endswith("… (fork 2)")
    assert fitted_title("巴黎" * 8 + " (fork)", 14).cell_len == 14
    assert fitted_title(parent, 22).plain == parent[:21] + "…"  # no tag: cut at the end
    assert fitted_title("short (fork)", 40).plain == "short (fork)"
    assert fitted_title(parent + " (fork)", 9).plain == "What is…"  # too narrow for the tag
    assert split_tag("(fork)") == ("(fork)", "") and split_tag("a (fork 3)") == ("a", " (fork 3)")


def test_notices_name_a_fork_with_its_tag():
    from ds4tui.screens.widgets.title_fit import short_title

    title = "Give me three tips for learning to cook quickly… (fork)"
    assert short_title(title) == "Give me three tips for learning… (fork)"
    assert short_title("Evil \x1b[2J title") == "Evil \\e[2J title"
