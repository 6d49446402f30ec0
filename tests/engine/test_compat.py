"""Files written before a refactor still load after it.

Model fingerprints and the `.kv` bytes must depend on the model (family, config, weight
values) only, never on where the code lives: `tests/data/619eb389….kv` was written by
ds4tui before the engine moved into per-family packages (tiny-llama, a 40-token
prompt, reason `cold`). A deliberate change to a fingerprint recipe or a tiny model's
recipe breaks these tests on purpose: old files then stop loading, so say so in the
change and update the data.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ds4tui.cache.policy import CachePolicy
from ds4tui.chat.checkpoints import Checkpoints
from ds4tui.engine.loader import load_model

DATA = Path(__file__).parent.parent / "data"
OLD_LLAMA_FILE = DATA / "619eb3898f2a2b4798a8976a35878a3611214983.kv"
OLD_PROMPT = [{"role": "user", "content": "Hello there, old file."}]
# tiny-dsv4's fingerprint as computed before the move (its payload file is too large to keep).
OLD_DSV4_FINGERPRINT = "a3bbdfd6ccef010caf881c8914ac92708f3d686c7b95100437fb01b6eded3c00"


def test_a_llama_file_written_before_the_move_restores_exactly(tmp_path):
    """The old file holds f32 rows: an f32 session (kv_dtype = "f32") restores it (its 40
    tokens, and logits from the stored rows as a fresh prefill's up to float summation order:
    the rows were computed by the torch attention of that time, a fresh prefill now attends
    in C); an f16 session (the default) rejects it with that reason, keeps the file, and goes
    on cold."""
    model = load_model("tiny-llama")
    shutil.copy(OLD_LLAMA_FILE, tmp_path / OLD_LLAMA_FILE.name)
    prompt = model.chat.render(OLD_PROMPT, add_generation_prompt=True).encode()
    checkpoints = Checkpoints(model, tmp_path, CachePolicy(), ctx_size=256)
    restored = model.new_session(256, kv_dtype="f32")
    events: list = []
    assert checkpoints.restore_longest(prompt, restored, events.append) == len(prompt)
    fresh = model.new_session(256, kv_dtype="f32")
    fresh.prefill(model.tokenizer.encode(prompt.decode()))
    assert restored.tokens == fresh.tokens and len(fresh.tokens) == 40
    assert torch.allclose(restored.logits, fresh.logits, rtol=0, atol=1e-4)
    again = model.new_session(256, kv_dtype="f32")
    assert checkpoints.restore_longest(prompt, again, events.append) == len(prompt)
    assert torch.equal(again.logits, restored.logits)  # a restore itself is exact
    half = model.new_session(256)
    events.clear()
    assert checkpoints.restore_longest(prompt, half, events.append) == 0 and half.tokens == []
    rejected = [e for e in events if "K/V rows" in str(getattr(e, "reason", ""))]
    assert rejected and not rejected[0].deleted
    assert "payload holds f32 K/V rows, this session's kv_dtype is f16" in rejected[0].reason
    assert (tmp_path / OLD_LLAMA_FILE.name).exists()


def test_the_dsv4_fingerprint_does_not_depend_on_module_paths():
    assert load_model("tiny-dsv4").info.fingerprint.hex() == OLD_DSV4_FINGERPRINT


def test_kv_inspect_names_the_row_order_of_old_and_new_files(tmp_path, capsys, monkeypatch):
    """The old file's rows are token-major; a file written now is head-major (docs/payload.md)."""
    import json

    from ds4tui.cli import main

    model = load_model("tiny-llama")
    shutil.copy(OLD_LLAMA_FILE, tmp_path / OLD_LLAMA_FILE.name)
    session = model.new_session(256)
    session.prefill(model.tokenizer.encode("A new file."))
    checkpoints = Checkpoints(model, tmp_path, CachePolicy(), ctx_size=256)
    new_sha = checkpoints.save(session, b"A new file.", "cold", lambda e: None)
    monkeypatch.setenv("DS4TUI_CACHE_DIR", str(tmp_path))
    rows = {}
    for sha in (OLD_LLAMA_FILE.stem, new_sha):
        capsys.readouterr()
        assert main(["kv", "inspect", sha, "--json"]) == 0
        payload = json.loads(capsys.readouterr().out)["payload"]
        rows[sha] = (payload["kv_rows"], payload["kv_dtype"])
        assert main(["kv", "inspect", sha]) == 0
        assert f"kv_rows              {payload['kv_rows']}" in capsys.readouterr().out
    assert rows == {OLD_LLAMA_FILE.stem: ("token-major", "f32"), new_sha: ("head-major", "f16")}
