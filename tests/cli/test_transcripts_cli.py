"""`ds4tui kv grep`, `kv export` and `ds4tui import`: round trips through real files a
controller wrote, with no model loaded for ChatML and DeepSeek V4 transcripts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ds4tui.chat import transcript
from ds4tui.cli import main
from tests.chat.conftest import Recorder, make_controller


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two titled chats on tiny-llama (ChatML) in one cache directory."""
    from ds4tui.engine.loader import load_model

    d = tmp_path_factory.mktemp("kv")
    ctl = make_controller(load_model("tiny-llama"), d, max_tokens=4)
    a = ctl.new_conversation()
    ctl.send(a.key, "Where is the lighthouse keeper?", Recorder())
    ctl.send(a.key, "And the harbour?", Recorder())
    b = ctl.new_conversation()
    ctl.send(b.key, "Something else entirely.", Recorder())
    ctl.rename(b.key, "Groceries")
    return d, a, b


def test_grep_finds_titles_and_lines(saved, capsys):
    d, a, b = saved
    assert main(["kv", "grep", "HARBOUR", "--dir", str(d), "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert {"sha", "title", "line"} <= set(hits[0])
    assert [(h["sha"], h["role"], h["line"]) for h in hits if h["sha"] == a.saved_sha] == [
        (a.saved_sha, "user", "And the harbour?")]
    assert all(h["title"] == a.title for h in hits if h["sha"] == a.saved_sha)
    assert main(["kv", "grep", "grocer", "--dir", str(d), "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert any(h["sha"] == b.saved_sha and h["role"] == "title" for h in hits)
    assert main(["kv", "grep", "light.*keeper", "--regex", "--dir", str(d)]) == 0
    assert "lighthouse keeper" in capsys.readouterr().out
    assert main(["kv", "grep", "no such words anywhere", "--dir", str(d)]) == 1


def test_export_json_and_import_round_trip(saved, tmp_path, capsys):
    from ds4tui.engine.loader import load_model

    d, a, _ = saved
    assert main(["kv", "export", a.saved_sha[:10], "--format", "json", "--dir", str(d)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["title"] == a.title and data["sha"] == a.saved_sha and data["created_at"] == a.created_at
    chat = load_model("tiny-llama").chat  # its template adds the default system prompt
    assert data["messages"] == chat.parse(chat.render(a.messages, add_generation_prompt=False))
    assert data["messages"][1:] == a.messages
    # By title too, to a file; and the file imports as the same messages.
    out = tmp_path / "chat.json"
    assert main(["kv", "export", a.title, "--format", "json", "--dir", str(d), "-o", str(out)]) == 0
    messages, title, created = transcript.load_json_file(out)
    assert (messages, title, created) == (data["messages"], a.title, a.created_at)
    ctl = make_controller(load_model("tiny-llama"), d, max_tokens=2)
    conv = ctl.import_messages(messages, title, created)
    done = ctl.send(conv.key, "Continue.", Recorder())
    # The imported transcript is the saved chat's: its titled file... is named by title, so the
    # turn finds the untitled checkpoints or prefills; either way the reply comes.
    assert done is not None and conv.messages[: len(messages)] == messages


def test_export_markdown_is_terminal_safe(saved, capsys):
    d, a, _ = saved
    assert main(["kv", "export", a.saved_sha, "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# {a.title}\n") and "## user\n\nAnd the harbour?" in out
    assert "\x1b" not in out


def test_export_to_an_unwritable_path_says_why_in_one_line(saved, tmp_path, capsys):
    d, a, _ = saved
    out = tmp_path / "no such folder" / "chat.md"
    assert main(["kv", "export", a.saved_sha, "--dir", str(d), "-o", str(out)]) != 0
    err = capsys.readouterr().err
    assert f"cannot write {out}: No such file or directory" in err and "Traceback" not in err
    assert not out.exists()


def test_export_needs_no_torch_for_chatml(saved):
    d, a, _ = saved
    code = ("import sys; from ds4tui.cli import main; "
            f"rc = main(['kv', 'export', '{a.saved_sha}', '--format', 'json', '--dir', {str(d)!r}]); "
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH', file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "NOTORCH" in out.stderr, out.stderr


def test_import_checks_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"messages": [{"role": "tool", "content": "x"}]}))
    assert main(["import", str(bad)]) == 1
    assert "role must be one of" in capsys.readouterr().err
    assert transcript.from_json([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])[0] == [
        {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name, reason", [
    ("missing.json", "cannot read {}: no such file"),
    ("", "cannot read {}: is a directory"),
    ("latin1.json", "cannot import {}: not UTF-8 text"),
])
def test_import_of_an_unreadable_file_is_one_plain_line(tmp_path, capsys, name, reason):
    """No "[Errno 2] No such file or directory: '...'": the reason in words, the path once."""
    (tmp_path / "latin1.json").write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    path = tmp_path / name if name else tmp_path
    assert main(["import", str(path)]) == 1
    assert capsys.readouterr().err == "ds4tui: " + reason.format(path) + "\n"


def test_dsv4_transcripts_parse_without_the_model():
    from ds4tui.engine.text.dsv4_chat import Dsv4ChatTemplate

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    text = Dsv4ChatTemplate().render(msgs, add_generation_prompt=False)
    assert transcript.parse_text(text) == msgs
    with pytest.raises(ValueError):
        transcript.parse_text("plain text, no template")
