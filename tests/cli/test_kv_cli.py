"""`ds4tui kv ...` through `ds4tui.cli.main`: output, JSON keys, edits, errors and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4tui.cli import main
from ds4tui.cache.entry import JSON_KEYS
from ds4tui.format.kvc import EXT_PINNED, EXT_SESSION_TITLE, EXT_TOOL_MAP
from ds4tui.format.payload import DSV4_FIELDS
from tests.cache.kvc_builders import dsv4_payload, title_trailer, tool_map_trailer, write_kv

EXPECTED_KEYS = [
    "sha", "path", "valid", "error", "magic", "version", "quant_bits", "reason", "reason_code",
    "ext_flags", "ext_flag_names", "model_id", "tokens", "hits", "ctx_size", "payload_abi",
    "created_at", "last_used", "payload_bytes", "text_bytes", "file_bytes", "title", "pinned",
    "text_preview", "payload", "trailers", "checksum",
]


@pytest.fixture
def kvdir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "kv"
    monkeypatch.setenv("DS4TUI_CACHE_DIR", str(d))
    # One file ds4 wrote (not loadable here), one of ours, one titled with hostile text.
    write_kv(d, b"<sys>You are helpful\x1b[31m", dsv4_payload(600), tokens=600, model=0, abi=2, quant=2)
    write_kv(d, b"our prefix", dsv4_payload(5), tokens=5, model=0x80, abi=128, quant=8, ctx=4096, reason=2)
    title = "Evil \x1b]0;pwned\x07 title".encode()
    created = 1_700_000_000
    import hashlib
    import struct
    name = hashlib.sha1(title + struct.pack("<Q", created)).hexdigest() + ".kv"
    write_kv(d, b"titled text", dsv4_payload(7), name=name, tokens=7, model=0x81, abi=128, reason=6,
             ext=EXT_TOOL_MAP | EXT_SESSION_TITLE, created=created,
             trailers=tool_map_trailer([(b"call_1", b"<dsml/>")]) + title_trailer(title))
    return d


def shas(d: Path) -> list[str]:
    return sorted(p.name[:40] for p in d.glob("*.kv"))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_shows_one_row_per_file_with_escaped_text(kvdir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # room for the whole title
    code, out, err = run(capsys, "kv", "ls")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("SHA") and "SCORE" in lines[0] and "STATUS" in lines[0]
    assert len(lines) == 1 + 3 + 1
    assert "not loadable here: payload ABI 2 (ds4)" in out
    assert "deepseek-v4-flash" in out and "ds4tui-llama" in out and "ds4tui-dsv4" in out
    assert "Evil \\e]0;pwned\\x07 title" in out
    assert "\x1b" not in out and "\x07" not in out


def test_kv_without_a_verb_lists(kvdir, capsys):
    assert run(capsys, "kv")[1] == run(capsys, "kv", "ls")[1]


def test_ls_json_has_the_inspect_keys(kvdir, capsys):
    code, out, _ = run(capsys, "kv", "ls", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 3
    assert all(list(r) == EXPECTED_KEYS for r in rows)
    assert "\x1b" not in out
    by_model = {r["model_id"]: r for r in rows}
    assert by_model[0]["valid"] is False and by_model[0]["error"].startswith("not loadable here")
    assert by_model[0x80]["valid"] is True and by_model[0x80]["error"] is None
    assert by_model[0x81]["title"] == "Evil \x1b]0;pwned\x07 title"
    assert by_model[0x81]["ext_flag_names"] == ["tool-map", "session-title"]


def test_ls_of_an_empty_or_missing_dir(tmp_path, capsys):
    code, out, _ = run(capsys, "kv", "ls", "--dir", str(tmp_path / "nothing"))
    assert code == 0 and "no .kv files" in out
    assert json.loads(run(capsys, "kv", "ls", "--dir", str(tmp_path / "nothing"), "--json")[1]) == []


def test_inspect_json_keys_exactly_and_payload_fields(kvdir, capsys):
    assert EXPECTED_KEYS == list(JSON_KEYS)
    titled = [s for s in shas(kvdir) if json.loads(run(capsys, "kv", "inspect", s, "--json")[1])["title"]][0]
    code, out, _ = run(capsys, "kv", "inspect", titled[:10], "--json")
    obj = json.loads(out)
    assert code == 0 and list(obj) == EXPECTED_KEYS
    assert obj["sha"] == titled and obj["reason"] == "agent-session" and obj["reason_code"] == 6
    assert list(obj["payload"]) == list(DSV4_FIELDS) + ["swa_policy", "kv_dtype", "kv_rows"] and obj["payload"]["token_count"] == 7
    assert obj["payload"]["swa_policy"] == "full"  # payload_version 1 (docs/swa_policies.md)
    assert obj["payload"]["kv_dtype"] == "f32"  # no KV_F16 bit
    assert obj["payload"]["kv_rows"] == "token-major"  # a DSV4 file: ds4's raw rows
    assert obj["trailers"]["tool_map"] == {"count": 1, "ids": ["call_1"], "dsml_bytes": 7}
    assert obj["text_preview"] == "titled text"


def test_inspect_text_by_path_shows_every_field(kvdir, capsys):
    path = next(p for p in kvdir.glob("*.kv") if p.read_bytes()[7] == 0)
    code, out, _ = run(capsys, "kv", "inspect", str(path))
    assert code == 0
    for word in ("reason", "cold (1)", "ext_flags", "model_id", "0 (deepseek-v4-flash)", "payload_abi",
                 "2 (ds4)", "quant_bits", "ctx_size", "created_at", "last_used", "payload_bytes",
                 "text_bytes", "score", "payload (DSV4 header):", "token_count", "live_raw_rows",
                 "text preview:", "You are helpful\\e[31m", "status", "not loadable here"):
        assert word in out, word
    assert "\x1b" not in out


def test_inspect_a_corrupt_file_prints_it_and_exits_1(kvdir, capsys):
    path = next(p for p in kvdir.glob("*.kv") if p.read_bytes()[7] == 0x80)
    data = bytearray(path.read_bytes())
    data[53] ^= 1  # flip a bit of the stored text: the name no longer matches
    path.write_bytes(bytes(data))
    code, out, err = run(capsys, "kv", "inspect", str(path))
    assert code == 1 and "stored text hash" in out
    assert err.count("\n") == 1 and "does not match the file name" in err


@pytest.mark.parametrize("target, message", [
    ("/no/such/file.kv", "no such file"),
    ("ffffffff", "no .kv file matches 'ffffffff'"),
])
def test_inspect_missing_is_exit_1_with_one_line(kvdir, capsys, target, message):
    code, out, err = run(capsys, "kv", "inspect", target)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and message in err


def test_inspect_a_file_that_is_not_kvc(tmp_path, capsys):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello")
    code, out, err = run(capsys, "kv", "inspect", str(junk))
    assert code == 1 and out == "" and "truncated header" in err


def test_pin_unpin_rm(kvdir, capsys):
    sha = next(p for p in kvdir.glob("*.kv") if p.read_bytes()[7] == 0x80).name[:40]
    path = kvdir / f"{sha}.kv"
    code, out, _ = run(capsys, "kv", "pin", sha[:8])
    assert code == 0 and out.strip() == f"pinned {sha}"
    assert path.read_bytes()[6] & EXT_PINNED
    assert json.loads(run(capsys, "kv", "inspect", sha, "--json")[1])["pinned"] is True
    assert run(capsys, "kv", "unpin", sha[:8])[0] == 0
    assert not path.read_bytes()[6] & EXT_PINNED
    assert run(capsys, "kv", "rm", sha[:8])[0] == 0
    assert not path.exists()
    code, _, err = run(capsys, "kv", "rm", sha[:8])
    assert code == 1 and "no .kv file matches" in err


def test_pinning_a_ds4_file_says_the_pin_holds_against_ds4tui_only(kvdir, capsys):
    ds4_file = next(p for p in kvdir.glob("*.kv") if p.read_bytes()[4] == 2)  # quant 2: ds4 lists it
    ours = next(p for p in kvdir.glob("*.kv") if p.read_bytes()[7] == 0x80)
    code, out, _ = run(capsys, "kv", "pin", ds4_file.name[:40])
    assert code == 0 and out.startswith("pinned ") and "holds against ds4tui only" in out
    code, out, _ = run(capsys, "kv", "pin", ours.name[:40])
    assert code == 0 and "ds4" not in out


def test_ambiguous_prefix_lists_the_candidates(kvdir, capsys):
    write_kv(kvdir, b"x", dsv4_payload(1), tokens=1, name="ab" + "0" * 38 + ".kv")
    write_kv(kvdir, b"y", dsv4_payload(1), tokens=1, name="ab" + "1" * 38 + ".kv")
    code, out, err = run(capsys, "kv", "pin", "ab")
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert "ambiguous prefix 'ab' matches 2 files" in err and "ab0000000000" in err and "ab1111111111" in err


def test_evict_dry_run_then_real(kvdir, capsys):
    before = shas(kvdir)
    code, out, _ = run(capsys, "kv", "evict", "--budget-mb", "0", "--dry-run")
    assert code == 0 and out.count("would evict ") == 4  # three files + the summary line
    assert shas(kvdir) == before
    keep = before[0]
    run(capsys, "kv", "pin", keep)
    code, out, _ = run(capsys, "kv", "evict", "--budget-mb", "0")
    assert code == 0 and "evicted 2 file(s)" in out and "pinned" in out
    assert shas(kvdir) == [keep]
    code, out, _ = run(capsys, "kv", "evict", "--dir", str(kvdir))
    assert "nothing to evict" in out and "within the 4.0 GiB budget" in out  # one size format


def test_ls_of_a_directory_that_does_not_exist_says_so(tmp_path, capsys):
    code, out, _ = run(capsys, "kv", "ls", "--dir", str(tmp_path / "nowhere"))
    assert code == 0 and "no such directory" in out and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("argv", [
    ["kv", "ls", "--bogus"],
    ["kv", "evict", "--budget-mb", "lots"],
    ["kv", "inspect"],
    ["kv", "frobnicate"],
])
def test_bad_flags_exit_2_with_usage(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_ls_fits_a_100_column_terminal_and_widens_the_title(kvdir, capsys, monkeypatch):
    """The table was 150 columns; at 100 the rows of valid files fit (this directory mixes
    models, so the model column is there), and a wider terminal goes to the title."""
    monkeypatch.setenv("COLUMNS", "100")
    narrow = run(capsys, "kv", "ls")[1].splitlines()
    ok_rows = [line for line in narrow[1:-1] if line.endswith(" ok")]
    assert len(ok_rows) == 2 and all(len(line) <= 100 for line in ok_rows)
    assert "Evil \\e]0;pwned" not in "\n".join(narrow)  # cut to the narrow title column
    monkeypatch.setenv("COLUMNS", "160")
    wide = run(capsys, "kv", "ls")[1]
    assert "Evil \\e]0;pwned\\x07 title" in wide


def test_ls_scores_read_without_exponents(kvdir, capsys):
    out = run(capsys, "kv", "ls")[1]
    assert "e-0" not in out and "e+0" not in out


def test_ls_names_untitled_checkpoints_as_the_cache_browser_does(tmp_path, capsys, monkeypatch):
    """No "-" titles: a checkpoint of a titled chat reads "↳ <its title>", a lone one its first
    user message, a system-prompt checkpoint "system: …" (the browser's rule, chat/file_names.py)."""
    from ds4tui.cache import KvStore
    from ds4tui.chat.file_names import name_entries
    from tests.ui import kv_fixtures as fx

    d = tmp_path / "kv"
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    fx.titled_session(d, title="Trip to Lisbon")
    fx.cold_checkpoint(d, system + "<|im_start|>user\nPlan three days in Lisbon. \x1b[31mred?\x1b[0m<|im_end|>\n")
    fx.cold_checkpoint(d, system + "<|im_start|>user\nWhat is a\nmonad?<|im_end|>\n<|im_start|>assistant\nA mon")
    fx.cold_checkpoint(d, "<|im_start|>system\nBe brief.<|im_end|>\n")
    monkeypatch.setenv("DS4TUI_CACHE_DIR", str(d))
    monkeypatch.setenv("COLUMNS", "160")
    code, out, err = run(capsys, "kv", "ls")
    assert code == 0 and err == ""
    rows = out.splitlines()[1:-1]
    title_at = out.splitlines()[0].index("TITLE")
    shown = sorted(row[title_at:].rsplit(" ", 1)[0].strip() for row in rows)
    assert shown == sorted(["Trip to Lisbon", "↳ Trip to Lisbon", "What is a monad?",
                            "system: Be brief."])
    browser = sorted(n.text for n in name_entries(KvStore(d).entries()).values())
    assert shown == browser
