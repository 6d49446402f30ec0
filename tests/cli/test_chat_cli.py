"""`ds4tui` (the chat): every one-line failure happens before the full-screen UI starts."""

from __future__ import annotations

from ds4tui import paths
from ds4tui.cli import main


def test_missing_model_names_the_pull_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "empty"))
    assert main(["--model", "smollm2-135m-instruct"]) == 1
    err = capsys.readouterr().err
    assert "ds4tui models pull smollm2-135m-instruct" in err and err.count("\n") == 1


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
