"""docs/format.md's tables match the code's constants (ds4's README drifted; ours must not)."""

from __future__ import annotations

import re
from pathlib import Path

from ds4tui.format import kvc
from ds4tui.cache.entry import JSON_KEYS
from ds4tui.format.payload import DSV4_FIELDS

FORMAT_DOC = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def _section() -> str:
    text = FORMAT_DOC.read_text(encoding="utf-8")
    start = text.index("## KVC file format")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _table(title: str) -> list[list[str]]:
    """Rows (cells stripped, backticks removed) of the first table under `### title`."""
    sec = _section()
    start = sec.index(f"### {title}\n")
    end = sec.find("\n### ", start + 1)
    block = sec[start:] if end < 0 else sec[start:end]
    rows = [line for line in block.splitlines() if line.startswith("|")]
    return [[c.strip().strip("`") for c in r.strip("|").split("|")] for r in rows[2:]]


def test_header_table_matches_the_struct():
    rows = _table("Header")
    sizes = {"u8": 1, "u8[3]": 3, "u32": 4, "u64": 8}
    offset = 0
    for off, typ, _field, _meaning in rows:
        assert int(off) == offset, (off, offset)
        offset += sizes[typ]
    assert offset == kvc.PREFIX_BYTES
    fields = {r[2]: int(r[0]) for r in rows}
    assert fields["ext_flags"] == kvc.OFFSET_EXT_FLAGS
    assert fields["hits"] == kvc.OFFSET_HITS
    assert fields["last_used"] == kvc.OFFSET_LAST_USED
    assert fields["model_id"] == 7 and fields["payload_abi"] == 20
    assert [(int(r[0]), sizes[r[1]], r[2]) for r in rows] == list(kvc.HEADER_FIELDS)


def test_reason_table_matches_the_code():
    assert {int(r[0]): r[1] for r in _table("Save reasons")} == kvc.REASON_NAMES


def test_ext_flag_table_matches_the_code():
    rows = _table("Extension flags")
    assert {1 << int(r[0]): r[2] for r in rows} == kvc.EXT_FLAG_NAMES
    assert all(int(r[1], 16) == 1 << int(r[0]) for r in rows)


def test_model_and_abi_tables_match_the_code():
    assert {int(r[0]): r[1] for r in _table("Model ids")} == kvc.MODEL_NAMES
    assert {int(r[0]): r[1] for r in _table("Payload ABIs")} == kvc.PAYLOAD_ABI_NAMES


def test_trailer_and_payload_text_match_the_code():
    sec = _section()
    assert f"`{kvc.TOOL_MAP_MAGIC.decode()}`, u8 version {kvc.TOOL_MAP_VERSION}" in sec
    listed = re.search(r"13 u32 fields\s*\((.*?)\)", sec, re.S).group(1)
    assert tuple(re.findall(r"`(\w+)`", listed)) == DSV4_FIELDS


def test_json_key_table_matches_the_code():
    assert tuple(r[0] for r in _table("`kv inspect --json` keys")) == JSON_KEYS
