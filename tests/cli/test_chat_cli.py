"""`ds4tui` (the chat): every one-line failure happens before the full-screen UI starts."""

from __future__ import annotations

from ds4tui import paths
from ds4tui.cli import main


def test_a_registered_model_not_yet_downloaded_is_left_to_the_start_screen(tmp_path, monkeypatch, capsys):
    """The chat pulls it with its progress (tests/ui/test_start_screen.py); here the one check
    that fails is the missing terminal, not the missing model."""
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "empty"))
    assert main(["--model", "smollm2-135m-instruct"]) == 1
    err = capsys.readouterr().err
    assert "needs a terminal" in err and "models pull" not in err and err.count("\n") == 1


def test_unknown_model_spec(capsys):
    assert main(["--model", "no-such-model-anywhere"]) == 1
    assert "unknown model 'no-such-model-anywhere'" in capsys.readouterr().err


def test_bad_config_file_names_the_key(capsys):
    paths.config_path().write_text("budget_mb = -5\n")
    assert main(["--model", "tiny-llama"]) == 1
    assert "budget_mb must be > 0" in capsys.readouterr().err


def test_resume_that_matches_nothing(capsys):
    assert main(["--model", "tiny-llama", "--resume", "abc123"]) == 1
    assert "--resume 'abc123': no saved session matches" in capsys.readouterr().err


def test_resume_without_disk_cache(capsys):
    assert main(["--model", "tiny-llama", "--resume", "x", "--no-disk-cache"]) == 1
    assert "--resume needs the disk cache" in capsys.readouterr().err


def _titled(directory, title: str, created: int) -> str:
    """A titled session file as the store writes it (a minimal valid one)."""
    from tests.cli.test_kv_cli import dsv4_payload, title_trailer, write_kv
    from ds4tui.format.kvc import EXT_SESSION_TITLE, title_sha

    sha = title_sha(title.encode(), created)
    write_kv(directory, b"chat text " + title.encode(), dsv4_payload(5), name=f"{sha}.kv", tokens=5,
             model=0x80, abi=128, reason=6, ext=EXT_SESSION_TITLE, created=created,
             trailers=title_trailer(title.encode()))
    return sha


def test_resume_by_the_start_of_a_title(tmp_path, monkeypatch, capsys):
    """`--resume "Long paste"` names "Long paste chat": it gets past the check (and then
    refuses only because this test's stdout is not a terminal)."""
    d = tmp_path / "kv"
    _titled(d, "Long paste chat", 1_700_000_000)
    _titled(d, "Lisbon trip", 1_700_000_100)
    assert main(["--model", "tiny-llama", "--resume", "long  PASTE"]) == 1
    assert "needs a terminal" in capsys.readouterr().err
    assert main(["--model", "tiny-llama", "--resume", "L"]) == 1
    assert "matches 2 sessions" in capsys.readouterr().err


def test_chat_outside_a_terminal_refuses_with_one_line(capsys):
    assert main(["--model", "tiny-llama"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ds4tui: the chat needs a terminal") and err.count("\n") == 1


def test_help_shows_the_defaults_and_the_real_cache_dir(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere, even at a hyphen

    def shown(text: str) -> bool:
        return "".join(text.split()) in out

    assert shown(f"(default: {paths.cache_dir()})") and not shown("platformdirs")
    assert shown("(default: 4096, or the model's own context if smaller)")
    assert shown("(default: smollm2-135m-instruct)") and shown("(default: 4096)")


def test_a_verbs_bad_flag_prints_that_verbs_usage(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["kv", "ls", "--bogus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("usage: ds4tui kv ls") and "unrecognized arguments: --bogus" in err


def test_usage_shows_the_chat_needs_no_command(capsys):
    """`ds4tui` alone starts the chat: the usage gives that form (flags only) its own line,
    before the `COMMAND ...` one, and a bad top-level flag still prints it with status 2."""
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    usage = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert usage[0].startswith("usage: ds4tui [-h] [--model MODEL]") and "COMMAND" not in " ".join(usage[:-1])
    assert usage[-1].split() == ["ds4tui", "COMMAND", "..."]
    with pytest.raises(SystemExit) as exc:
        main(["--bogus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("usage: ds4tui [-h]") and "ds4tui COMMAND ..." in err
    assert err.rstrip().endswith("ds4tui: error: unrecognized arguments: --bogus")
    with pytest.raises(SystemExit):
        main(["kv", "--help"])  # a subcommand's usage names it after the program, not after the usage
    assert capsys.readouterr().out.startswith("usage: ds4tui kv [-h] VERB ...")


def test_remote_resume_looks_in_the_conversation_store(tmp_path, capsys):
    """`--engine URL --resume NAME` finds the chat in the store (local and remote chats alike),
    before any connection: a name that matches nothing or several is one line."""
    from ds4tui.store import open_store

    store = open_store(paths.store_path(tmp_path))
    for title in ("Remote plans", "Remote plans, again"):
        store.commit(store.create(title=title, engine="http://127.0.0.1:9/v1"), [{"role": "user", "content": "hi"}])
    store.close()
    engine = ["--engine", "http://127.0.0.1:9/v1", "--data-dir", str(tmp_path)]
    assert main([*engine, "--resume", "nothing like it"]) == 1
    err = capsys.readouterr().err
    assert "--resume 'nothing like it' matches nothing in" in err and "conversations.sqlite3" in err
    assert main([*engine, "--resume", "Remote"]) == 1
    assert "matches 2 chats" in capsys.readouterr().err


def test_the_parser_loads_no_torch():
    """Every command's parser (the defaults its help prints included) is built without torch."""
    import subprocess
    import sys

    code = ("import sys; from ds4tui.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def _small_gguf(path, floats: int = 4096):
    """A GGUF of one f32 tensor, written by the gguf package (llama.cpp's writer)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.arange(floats, dtype=np.float32).reshape(16, -1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_file_that_is_no_model_gets_one_line_before_the_ui(tmp_path, monkeypatch, capsys):
    """/etc/passwd, a text file named .gguf, a GGUF cut short: one line naming the file and why,
    exit 1, before the UI (these opened the full app with "no model" and a raw numpy error)."""
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))  # where the check remembers a file
    text = tmp_path / "notes.txt"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    fake = tmp_path / "fake.gguf"
    fake.write_text("hello, not a model\n")
    whole = _small_gguf(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size - 1000])
    for path, why in ((text, "not a model: expected a .gguf file or a checkpoint directory"),
                      (fake, "not a GGUF file (no GGUF magic)"),
                      (cut, "truncated: tensor 'token_embd.weight' ends at byte"),
                      (tmp_path, "not a checkpoint directory (no config.json)")):
        assert main(["--model", str(path)]) == 1
        err = capsys.readouterr().err
        assert f"{path}: {why}" in err and err.count("\n") == 1, err
    # The whole file gets past the check (and is refused only because stdout is no terminal).
    assert main(["--model", str(whole)]) == 1
    assert "needs a terminal" in capsys.readouterr().err


def test_a_checked_file_is_checked_again_once_it_changes(tmp_path, monkeypatch, capsys):
    """The check remembers a file that passed by (path, size, mtime): a file cut short later is
    caught at the next start."""
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    whole = _small_gguf(tmp_path / "m.gguf")
    assert main(["--model", str(whole)]) == 1 and "needs a terminal" in capsys.readouterr().err
    data = whole.read_bytes()
    whole.write_bytes(data[:-1000])
    assert main(["--model", str(whole)]) == 1
    assert "truncated" in capsys.readouterr().err


def test_the_remote_chat_outside_a_terminal_refuses_with_one_line(tmp_path, capsys):
    """As the embedded chat: no UI started into a pipe (and no server asked for it)."""
    assert main(["--engine", "http://127.0.0.1:9/v1", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "needs a terminal" in err and err.count("\n") == 1
