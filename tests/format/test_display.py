"""The one terminal-safety rule and the one byte-size format (ds4tui.format.display)."""

from __future__ import annotations

import pytest

from ds4tui.format.display import count_text, human_bytes, one_line, safe_lines, safe_text

# Every character the rule keeps off the terminal: C0, DEL, C1, bidi embedding/override/isolate.
UNSAFE = ([chr(c) for c in range(0x20)] + [chr(c) for c in range(0x7F, 0xA0)]
          + [chr(c) for c in range(0x202A, 0x202F)] + [chr(c) for c in range(0x2066, 0x206A)])


def test_safe_text_escapes_controls_and_bad_utf8():
    assert safe_text("a\x1b[31mb\nc\x07d\x7f\x9b") == "a\\e[31mb\\nc\\x07d\\x7f\\x9b"
    assert safe_text("left\u202eright") == "left\\u202eright"
    assert safe_text("tab\tcr\r") == "tab\\tcr\\r"
    assert safe_text(b"ok\xff") == "ok\ufffd"
    assert safe_text("abcdef", 3) == "abc…"
    assert safe_text("ab cdef", 3) == "ab…"  # no space before the ellipsis
    assert safe_text("abc", 3) == "abc"
    assert safe_text(None) == ""


@pytest.mark.parametrize("ch", UNSAFE, ids=lambda c: f"U+{ord(c):04X}")
def test_no_unsafe_character_survives_any_form(ch):
    text = f"x{ch}y"
    assert ch not in safe_text(text) and ch not in one_line(text)
    if ch in "\n\t":
        assert safe_lines(text) == text  # the multi-line form keeps line breaks and tabs
    else:
        assert ch not in safe_lines(text) and safe_lines(text) == safe_text(text)


def test_safe_lines_keeps_layout_and_leaves_ordinary_text_alone():
    assert safe_lines("def f():\n\treturn 1\r\n") == "def f():\n\treturn 1\\r\n"
    assert safe_lines("héllo ✓ [bold]") == "héllo ✓ [bold]"
    assert safe_lines(b"bad \xff") == "bad \ufffd"


def test_one_line_collapses_whitespace_then_escapes_and_cuts():
    assert one_line("  Plan\n three\tdays  ") == "Plan three days"
    assert one_line("a \x1b[31m b") == "a \\e[31m b"
    assert one_line("Plan three days in Lisbon", 10) == "Plan three…"
    assert one_line(None) == ""


@pytest.mark.parametrize("n, shown", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), ((1 << 20) - 1, "1024.0 KiB"),
    (1 << 20, "1.0 MiB"), (183 << 20, "183.0 MiB"), (4096 << 20, "4.0 GiB"), (3 << 40, "3072.0 GiB"),
])
def test_human_bytes(n, shown):
    assert human_bytes(n) == shown


@pytest.mark.parametrize("n, width, shown", [
    (7, 4, "7"), (9999, 4, "9999"), (12345, 4, "12k"), (99_999, 4, "100k"), (999_999, 4, "1.0M"),
    (4294967295, 4, "4.3G"), (4294967295, 6, "4295M"), (4294967295, 10, "4294967295"), (123456, 6, "123456"),
])
def test_a_count_fits_its_column_and_is_never_cut(n, width, shown):
    assert count_text(n, width) == shown and len(shown) <= width


def test_the_browser_hits_cell_of_the_largest_count_is_whole():
    from ds4tui.cache.entry import KvEntry
    from ds4tui.format.kvc import KvcHeader
    from ds4tui.screens.widgets.kv_table import COLUMNS, row_cells

    h = KvcHeader(quant_bits=8, reason_code=1, ext_flags=0, model_id=0x80, tokens=4294967295, hits=4294967295,
                  ctx_size=4096, payload_abi=128, created_at=1, last_used=1, payload_bytes=0, text_bytes=0)
    cells = row_cells(KvEntry(path="x.kv", sha=None, file_bytes=52, header=h), now=2)
    widths = {c.key: c.width for c in COLUMNS}
    assert cells["hits"].plain == "4.3G" and len(cells["hits"].plain) <= widths["hits"]
    assert cells["tokens"].plain == "4295M"  # 6 columns: the closer unit that fits


def test_local_time_is_the_one_time_format(monkeypatch):
    """Commands, exports and the browser write a time one way; a missing one as NO_TIME."""
    import time

    from ds4tui.chat.transcript import to_markdown
    from ds4tui.format.display import NO_TIME, local_time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert local_time(1_700_000_000) == "2023-11-14 22:13"
        assert local_time(1_700_000_000, seconds=True) == "2023-11-14 22:13:20"
        assert local_time(0) == local_time(None) == NO_TIME == "-"
        assert local_time(10**20) == f"@{10**20}"  # a corrupt header's stamp: shown, not raised
        assert "_created - · last used 2023-11-14 22:13_" in to_markdown([], "t", None, 1_700_000_000)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
