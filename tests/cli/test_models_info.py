"""`ds4tui models info SPEC`: the model line, and one-line errors for files we cannot run."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from ds4tui.cli import main


def test_info_names_architecture_weights_and_attention(capsys):
    assert main(["models", "info", "tiny-llama"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny-llama: llama, 2 layers, hidden 64; weights F32") and "full attention" in out


def test_a_base_model_says_it_is_one():
    """gemma3-270m is pretrained only: chatting with it echoes and rambles, which looked like a
    broken app; `models info` and the chat (ChatScreen on ModelReady) say so."""
    from ds4tui.engine.registry import DEFAULT_MODEL, base_model_note

    note = base_model_note("gemma3-270m")
    assert note and "base model" in note and DEFAULT_MODEL in note
    assert base_model_note(DEFAULT_MODEL) is None and base_model_note("tiny-llama") is None
    assert base_model_note("/some/file.gguf") is None


def _gguf(path, arch: str, tensor_type=None) -> str:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_context_length(64)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_token_types([1, 1])
    w.add_token_merges([])
    w.add_tensor("token_embd.weight", np.zeros((2, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize("arch", ["phi3", "gpt2"])
def test_unsupported_architecture_is_one_line_naming_the_supported_ones(tmp_path, monkeypatch, capsys, arch):
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    assert main(["models", "info", _gguf(tmp_path / "m.gguf", arch)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"architecture {arch!r} is not supported" in err
    assert "llama, qwen2, qwen3, gemma3" in err
