"""`ds4tui chats ...` through `ds4tui.cli.main`: the conversation store from the command line,
over a cache directory and transcripts an older ds4tui left (tests/chat/test_history_import.py)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ds4tui.cli import main
from ds4tui.store import open_store
from tests.chat.test_history_import import old_user_dirs
from tests.ui import kv_fixtures as kvf

LS_KEYS = ["id", "title", "model", "engine", "messages", "created_at", "updated_at", "kv_sha", "kv_tokens", "kv",
           "archived"]


def _store_file():
    """The store this test's autouse fixture points DS4TUI_STORE at (its folder made)."""
    path = Path(os.environ["DS4TUI_STORE"])
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """The old dirs at the places the CLI looks by default, imported with `chats import --from-cache`."""
    kv, tr, want = old_user_dirs(tmp_path)
    monkeypatch.setenv("DS4TUI_CACHE_DIR", str(kv))
    monkeypatch.setenv("DS4TUI_TRANSCRIPTS_DIR", str(tr))
    monkeypatch.setenv("COLUMNS", "200")
    return kv, tr, want


def imported(capsys, dirs):
    code, out, err = run(capsys, "chats", "import", "--from-cache")
    assert code == 0 and err == "" and out == f"imported {len(dirs[2])} chat(s); 0 already in the store\n"
    return {c["title"]: c for c in ls_json(capsys)}


def ls_json(capsys, *extra):
    code, out, _ = run(capsys, "chats", "ls", "--json", *extra)
    assert code == 0
    return json.loads(out)


def test_ls_before_anything_is_stored_creates_nothing(tmp_path, capsys):
    code, out, err = run(capsys, "chats", "ls")
    assert code == 0 and err == "" and "no chats in" in out and "the chat creates it" in out
    assert run(capsys, "chats", "ls", "--json")[1] == "[]\n"
    assert run(capsys, "chats", "grep", "x")[0] == 1
    assert not (_store_file()).exists()


def test_import_from_cache_then_ls_lists_every_chat(dirs, capsys):
    kv, tr, want = dirs
    chats = imported(capsys, dirs)
    assert set(chats) == set(want)
    for title, row in chats.items():
        assert list(row) == LS_KEYS
        assert row["messages"] == sum(m["role"] != "system" for m in want[title]["messages"])
        if "sha" in want[title]:
            assert (row["engine"], row["kv"], row["kv_sha"]) == ("local", "kv", want[title]["sha"])
        else:
            assert (row["engine"], row["kv"], row["model"]) == (want[title]["engine"], "text only", want[title]["model"])
    code, out, err = run(capsys, "chats", "ls")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ID", "USED", "MSGS", "CACHE", "ENGINE", "MODEL", "TITLE"]
    assert len(lines) == 1 + len(want) + 1 and lines[-1].startswith(f"{len(want)} chat(s) in ")
    assert "\x1b" not in out and "\x07" not in out
    assert "Remote \\e]0;evil\\x07 recipe" in out and "Trip to Lisbon [bold]not markup[/bold]" in out
    lisbon = next(line for line in lines if "Lisbon" in line)
    assert " kv " in lisbon and " local " in lisbon and "smollm2-135m-instruct" in lisbon
    assert any("gpu-box:9000" in line and "text only" in line for line in lines)
    # Running it again finds them all there.
    assert run(capsys, "chats", "import", "--from-cache")[1] == f"imported 0 chat(s); {len(want)} already in the store\n"


def test_evicted_kv_leaves_every_chat_listed_as_text_only(dirs, capsys):
    """The budget story replayed at the command line: eviction deletes the .kv files, the
    store keeps every chat and every message."""
    kv, tr, want = dirs
    imported(capsys, dirs)
    code, out, _ = run(capsys, "kv", "evict", "--budget-mb", "0")
    assert code == 0 and "evicted" in out and not list(kv.glob("*.kv"))
    chats = {c["title"]: c for c in ls_json(capsys)}
    assert set(chats) == set(want) and {c["kv"] for c in chats.values()} == {"text only"}
    for title, expect in want.items():
        code, out, _ = run(capsys, "chats", "export", chats[title]["id"][:8], "--format", "json")
        assert code == 0 and json.loads(out)["messages"] == expect["messages"]


def test_show_prints_the_shown_path_escaped_with_its_versions(dirs, capsys, tmp_path):
    imported(capsys, dirs)
    code, out, err = run(capsys, "chats", "show", "trip to")
    assert code == 0 and err == ""
    assert out.startswith("Trip to Lisbon [bold]not markup[/bold]\nid ")
    assert "[user]\nPlan three days in Lisbon. \\e[31mred?\\e[0m\n" in out and "\x1b" not in out
    assert " · kv (" in out and "64 tokens" in out
    # A chat with two versions of its reply says which one it shows.
    store = open_store(_store_file())
    chat = store.create(title="Versions")
    store.commit(chat, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "second"}],
                 {1: ["first", "second"]})
    store.close()
    code, out, _ = run(capsys, "chats", "show", chat[:6])
    assert code == 0 and "[assistant] (version 2 of 2)\nsecond\n" in out and "text only" in out


def test_export_markdown_json_to_a_file_and_import_it_back(dirs, capsys, tmp_path):
    kv, tr, want = dirs
    chats = imported(capsys, dirs)
    code, out, _ = run(capsys, "chats", "export", "gemma colours")
    assert code == 0 and out.startswith("# Gemma colours\n") and "## assistant\n\nGreen.\n" in out
    target = tmp_path / "gemma.json"
    code, out, _ = run(capsys, "chats", "export", chats["Gemma colours"]["id"], "--format", "json", "-o", str(target))
    assert code == 0 and out == ""
    data = json.loads(target.read_text())
    assert data["messages"] == want["Gemma colours"]["messages"] and data["id"] == chats["Gemma colours"]["id"]
    assert data["sha"] == want["Gemma colours"]["sha"]
    code, out, _ = run(capsys, "chats", "import", str(target))
    assert code == 0 and out.startswith("imported ") and "Gemma colours (4 messages)" in out
    both = [c for c in ls_json(capsys) if c["title"] == "Gemma colours"]
    assert len(both) == 2 and {c["kv"] for c in both} == {"kv", "text only"}
    code, out, _ = run(capsys, "chats", "export", out.split()[1], "--format", "json")
    assert json.loads(out)["messages"] == data["messages"]


def test_ambiguous_and_missing_names_are_one_line(dirs, capsys):
    imported(capsys, dirs)
    code, out, err = run(capsys, "chats", "show", "remote")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("ds4tui: ambiguous: 2 chats match 'remote': ") and "Remote poem" in err
    assert "\x1b" not in err and "\\e]0;evil" in err
    code, _, err = run(capsys, "chats", "export", "no such chat")
    assert code == 1 and err.startswith("ds4tui: no chat matches 'no such chat' in ") and err.count("\n") == 1


def test_rm_asks_then_deletes_the_chat_and_its_kv_file_for_good(dirs, capsys, monkeypatch):
    kv, tr, want = dirs
    chats = imported(capsys, dirs)
    lisbon = chats[kvf.TITLE]
    kv_file = kv / f"{lisbon['kv_sha']}.kv"
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    code, out, _ = run(capsys, "chats", "rm", lisbon["id"][:8])
    assert code == 1 and "and its .kv file? [y/N]" in out and "nothing deleted" in out
    assert kv_file.exists() and len(ls_json(capsys)) == len(want)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # end of input is a no
    assert run(capsys, "chats", "rm", lisbon["id"][:8])[0] == 1 and kv_file.exists()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    code, out, _ = run(capsys, "chats", "rm", lisbon["id"][:8])
    assert code == 0 and "deleted " in out and not kv_file.exists()
    assert kvf.TITLE not in {c["title"] for c in ls_json(capsys)}
    # --yes asks nothing; the next start's import brings neither back.
    code, out, _ = run(capsys, "chats", "rm", "Remote poem", "--yes")
    assert code == 0 and "[y/N]" not in out
    assert run(capsys, "chats", "import", "--from-cache")[1].startswith("imported 0 chat(s)")
    assert len(ls_json(capsys)) == len(want) - 2


def test_rm_of_a_chat_made_after_the_store_leaves_nothing_to_import(tmp_path, capsys, monkeypatch):
    """A chat of this ds4tui (not imported): its titled file goes with it, or the next start's
    import would make it a chat again."""
    kv = tmp_path / "kv"
    sha = kvf.titled_session(kv, title="Mine")
    store = open_store(_store_file())
    chat = store.create(title="Mine")
    store.commit(chat, [{"role": "user", "content": "Hello"}], kv_sha=sha, kv_tokens=64)
    store.close()
    assert run(capsys, "chats", "rm", "mine", "-y")[0] == 0
    assert not list(kv.glob("*.kv"))
    assert run(capsys, "chats", "import", "--from-cache")[1].startswith("imported 0 chat(s); 0 already")
    assert ls_json(capsys) == []


def test_rm_of_a_chat_whose_kv_file_is_pinned_asks_twice(tmp_path, capsys, monkeypatch):
    """As the chat and the cache browser: a pinned file never goes on one "yes"."""
    kv = tmp_path / "kv"
    sha = kvf.titled_session(kv, title="Kept on purpose", pinned=True)
    store = open_store(_store_file())
    chat = store.create(title="Kept on purpose")
    store.commit(chat, [{"role": "user", "content": "Hello"}], kv_sha=sha, kv_tokens=64)
    store.close()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\nn\n"))
    code, out, _ = run(capsys, "chats", "rm", "kept", "--cache-dir", str(kv))
    assert code == 1 and "PINNED" in out and "nothing deleted" in out
    assert (kv / f"{sha}.kv").exists() and len(ls_json(capsys)) == 1
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\ny\n"))
    code, out, _ = run(capsys, "chats", "rm", "kept", "--cache-dir", str(kv))
    assert code == 0 and not (kv / f"{sha}.kv").exists() and ls_json(capsys) == []


def test_grep_text_json_and_errors(dirs, capsys):
    imported(capsys, dirs)
    code, out, _ = run(capsys, "chats", "grep", "GREEN")
    assert code == 0 and len(out.splitlines()) == 3  # Gemma, Llama and DeepSeek chats
    assert all("assistant: Green." in line for line in out.splitlines())
    code, out, _ = run(capsys, "chats", "grep", "answer [01]$", "--regex", "--json")
    hits = json.loads(out)
    assert code == 0 and {h["title"] for h in hits} == {"Remote poem", "Remote \x1b]0;evil\x07 recipe"}
    assert list(hits[0]) == ["id", "title", "where", "snippet"] and "\x1b" not in out
    assert run(capsys, "chats", "grep", "nowhere at all")[0] == 1
    code, _, err = run(capsys, "chats", "grep", "(", "--regex")
    assert code == 1 and err.startswith("ds4tui: bad regular expression '('")


def test_archived_chats_list_apart(tmp_path, capsys):
    store = open_store(_store_file())
    kept = store.create(title="Kept", messages=[{"role": "user", "content": "a"}])
    old = store.create(title="Put away", messages=[{"role": "user", "content": "b"}])
    store.update(old, archived=True)
    store.close()
    assert [c["id"] for c in ls_json(capsys)] == [kept]
    assert [c["id"] for c in ls_json(capsys, "--archived")] == [old]
    code, out, _ = run(capsys, "chats", "show", "put away")  # named even when archived
    assert code == 0 and " · archived" in out


def test_data_dir_picks_the_store_file(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    store = open_store(elsewhere / "conversations.sqlite3")
    store.create(title="Over there", messages=[{"role": "user", "content": "x"}])
    store.close()
    assert ls_json(capsys) == []
    assert [c["title"] for c in ls_json(capsys, "--data-dir", str(elsewhere))] == ["Over there"]


@pytest.mark.parametrize("argv", [["ls"], ["show", "x"], ["import", "--from-cache"], ["rm", "x", "--yes"]])
def test_a_store_that_cannot_be_opened_is_one_line_and_left_alone(tmp_path, capsys, argv):
    path = _store_file()
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    code, out, err = run(capsys, "chats", *argv)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"ds4tui: history file {path}: ") and "in memory" not in err
    assert path.read_bytes() == before


def test_import_of_a_bad_file_or_both_sources(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"role": "assistant", "content": "no question"}]))
    code, _, err = run(capsys, "chats", "import", str(bad))
    assert code == 1 and err == f"ds4tui: cannot import {bad}: it holds no user message\n"
    code, _, err = run(capsys, "chats", "import", str(bad), "--from-cache")
    assert code == 1 and "FILE.json or --from-cache" in err
    assert run(capsys, "chats", "import", str(tmp_path / "missing.json"))[2].endswith(": no such file\n")


def test_chats_loads_no_torch(dirs, capsys):
    imported(capsys, dirs)
    code = ("import sys; from ds4tui.cli import main; rc = main(['chats', 'export', 'gemma colours']) or "
            "main(['chats', 'ls']) or main(['chats', 'import', '--from-cache']); "
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH', file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "NOTORCH" in out.stderr, out.stderr
    assert "Gemma colours" in out.stdout


def test_a_name_with_control_characters_is_echoed_escaped(dirs, capsys):
    imported(capsys, dirs)
    code, _, err = run(capsys, "chats", "show", "x\x1b]0;t\x07\u202e")
    assert code == 1 and "\x1b" not in err and "\x07" not in err and "\u202e" not in err
    assert "'x\\x1b]0;t\\x07\\u202e'" in err
