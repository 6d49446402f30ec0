"""Which model wrote a cache directory's sessions (chat/model_memo.py): `--resume` and Enter in
`ds4tui browse` open a session with its own model, and a session of another model names it."""

from __future__ import annotations

import json
import os

from ds4tui.chat.model_memo import MAX_MEMO_BYTES, MEMO_NAME, file_fingerprint, remember, spec_for, writer_of
from ds4tui.cli import chat as chat_cli
from ds4tui.cli import main
from ds4tui.config import Config
from tests.chat.conftest import make_controller


def test_resume_opens_a_session_with_the_model_that_wrote_it(tiny_llama, tmp_path, monkeypatch, capsys):
    writer = make_controller(tiny_llama, tmp_path)  # its config names the model "tiny-llama"
    conv = writer.new_conversation()
    writer.send(conv.key, "A chat of the tiny model", lambda e: None)
    sha = conv.saved_sha
    assert file_fingerprint(tmp_path / f"{sha}.kv") == tiny_llama.info.fingerprint_hex
    assert writer_of(tmp_path, sha) == "tiny-llama"

    default = Config(model="smollm2-135m-instruct", cache_dir=str(tmp_path))
    assert chat_cli.resume_model(default, sha, explicit=False).model == "tiny-llama"
    assert chat_cli.resume_model(default, sha, explicit=True).model == "smollm2-135m-instruct"

    checked = []
    monkeypatch.setattr(chat_cli, "check_model", checked.append)
    assert main(["--resume", "a chat of the tiny", "--cache-dir", str(tmp_path)]) == 1
    assert "needs a terminal" in capsys.readouterr().err  # got as far as starting the UI ...
    assert checked == ["tiny-llama"]  # ... with the model that wrote the session
    assert main(["--resume", sha[:8], "--cache-dir", str(tmp_path), "--model", "tiny-dsv4"]) == 1
    assert checked[-1] == "tiny-dsv4"  # a model chosen on the command line is kept


def test_the_memo_is_best_effort_and_never_trusted_blindly(tmp_path):
    remember(tmp_path, "ab" * 32, "gemma3-270m")
    remember(tmp_path, "cd" * 32, str(tmp_path / "not-there.gguf"))
    assert spec_for(tmp_path, "ab" * 32) == "gemma3-270m" and spec_for(tmp_path, "ef" * 32) is None
    assert spec_for(tmp_path, None) is None
    assert not [n for n in os.listdir(tmp_path) if n != MEMO_NAME]  # no temp file left behind
    memo = tmp_path / MEMO_NAME
    memo.write_text("[not, a, mapping")
    assert spec_for(tmp_path, "ab" * 32) is None
    memo.write_text(json.dumps({"ab" * 32: 5, "cd" * 32: "x" * MAX_MEMO_BYTES}))
    assert spec_for(tmp_path, "ab" * 32) is None  # too big: ignored whole
    memo.unlink()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"ab" * 32: "evil"}))
    memo.symlink_to(elsewhere)
    assert spec_for(tmp_path, "ab" * 32) is None  # never read through a link
    assert file_fingerprint(tmp_path / "missing.kv") is None
    (tmp_path / ("0" * 40 + ".kv")).write_bytes(b"KVC" + bytes(100))
    assert file_fingerprint(tmp_path / ("0" * 40 + ".kv")) is None
