"""Small guards in front of the UI: --ctx beyond the model, a cache dir that cannot be used."""

from __future__ import annotations

import numpy as np
import pytest

from ds4tui.cli import main as cli_main
from ds4tui.cli.chat import _gguf_context_length


def test_ctx_beyond_the_model_is_a_one_line_error_before_the_ui(capsys):
    assert cli_main(["--model", "tiny-llama", "--ctx", "99999"]) == 1
    err = capsys.readouterr().err
    assert err == "ds4tui: --ctx 99999: tiny-llama has a context of 2048 tokens at most\n"


def test_gguf_context_length_matches_the_gguf_package(tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])  # arrays before the key are skipped
    w.add_string("general.name", "x")
    w.add_context_length(12345)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    want = int(gguf.GGUFReader(str(path)).fields["llama.context_length"].contents())
    assert _gguf_context_length(path) == want == 12345


def test_a_cache_dir_that_is_a_file_turns_the_disk_cache_off_with_a_notice(tmp_path):
    from ds4tui.engine.loader import load_model
    from tests.chat.conftest import Recorder, make_controller

    f = tmp_path / "file"
    f.write_text("x")
    ctl = make_controller(load_model("tiny-llama"), f)
    assert ctl.checkpoints is None and "is not a directory" in ctl.disk_cache_notice
    rec = Recorder()
    conv = ctl.new_conversation()
    ctl.send(conv.key, "hello", rec)
    assert rec.reply  # the chat goes on without the disk cache
    with pytest.raises(LookupError, match="disk cache off: .*is not a directory"):
        ctl.resume("anything")
