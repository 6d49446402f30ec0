"""`ds4tui kv export` and `kv grep` on files of every template the one transcript parser knows,
named as `--resume` names them; no model loaded for Gemma or Llama 3 files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ds4tui.cli import main
from ds4tui.cli.chat import check_resume
from ds4tui.cli.errors import CliError
from tests.chat.test_history_import import TURNS, published
from tests.ui import kv_fixtures as kvf


@pytest.fixture
def kvdir(tmp_path):
    d = tmp_path / "kv"
    shas = {
        "gemma": kvf.titled_session(d, title="Gemma colours", text=published("gemma3", "<bos>", TURNS),
                                    created=kvf.NOW - 10 * kvf.HOUR),
        "gemma2": kvf.titled_session(d, title="Gemma colours, second try",
                                     text=published("gemma3", "<bos>", TURNS[:2]), created=kvf.NOW - 11 * kvf.HOUR),
        "llama": kvf.titled_session(d, title="Llama  Colours", text=published("llama3_1", "<|begin_of_text|>", TURNS),
                                    created=kvf.NOW - 12 * kvf.HOUR),
        "plain": kvf.titled_session(d, title="Plain", text="no template wrote this", created=kvf.NOW - 13 * kvf.HOUR),
    }
    return d, shas


def export(capsys, d, query, *extra):
    code = main(["kv", "export", query, "--format", "json", "--dir", str(d), *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_gemma_and_llama3_files_export_without_a_model(kvdir, capsys):
    d, shas = kvdir
    code, data, _ = export(capsys, d, shas["gemma"][:8])
    assert code == 0 and data["messages"] == TURNS and data["title"] == "Gemma colours"
    code, data, _ = export(capsys, d, shas["llama"][:8])
    # Llama 3.1's template writes a system turn of its own (its knowledge date): the text holds it.
    assert code == 0 and data["messages"][1:] == TURNS and data["messages"][0]["role"] == "system"
    assert "Cutting Knowledge Date" in data["messages"][0]["content"]


def test_export_of_a_gemma_file_loads_no_torch(kvdir):
    d, shas = kvdir
    code = ("import sys; from ds4tui.cli import main; "
            f"rc = main(['kv', 'export', 'gemma colours', '--dir', {str(d)!r}]); "
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH', file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "NOTORCH" in out.stderr, out.stderr
    assert "## assistant\n\nGreen." in out.stdout


@pytest.mark.parametrize("query", ["Gemma colours", "gemma COLOURS", "llama colours", "LLAMA", "Gemma colours, sec",
                                   "Plain"])
def test_export_names_the_file_resume_names(kvdir, capsys, query):
    d, shas = kvdir
    picked = check_resume(query, d)
    code, data, err = export(capsys, d, query)
    if query == "Plain":
        assert code == 1 and "chat template" in err and "--model" in err
    else:
        assert code == 0 and data["sha"] == picked


def test_an_ambiguous_prefix_lists_the_candidates(kvdir, capsys):
    d, shas = kvdir
    code, _, err = export(capsys, d, "gemma")
    assert code == 1
    assert err.startswith("ds4tui: ambiguous: 2 files match: ") and err.count("\n") == 1
    assert shas["gemma"][:12] in err and shas["gemma2"][:12] in err and "no .kv file" not in err
    with pytest.raises(CliError, match="matches 2 sessions"):
        check_resume("gemma", d)  # --resume finds the same two


def test_no_match_says_so(kvdir, capsys):
    d, _ = kvdir
    code, _, err = export(capsys, d, "nothing like it")
    assert code == 1 and "no .kv file or titled session matches 'nothing like it'" in err


def test_grep_finds_gemma_and_llama3_lines_by_role(kvdir, capsys):
    d, shas = kvdir
    assert main(["kv", "grep", "green", "--dir", str(d), "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert {(h["sha"], h["role"], h["line"]) for h in hits} == {
        (shas["gemma"], "assistant", "Green."), (shas["llama"], "assistant", "Green.")}
