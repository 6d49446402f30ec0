"""build.py and how qgemv.py finds its library: the package build's library when it was built
from the sources beside it (no compiler needed), else a build in the data dir, compiled at
the model's load with progress (never inside a save), else the torch backend, saying why."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ds4tui.engine import loader, payload
from ds4tui.engine.kernels import build, qgemv

ROOT = Path(__file__).resolve().parents[3]

# Stands in for a compiler: writes each -o target (or fails on request) and logs its arguments.
FAKE_CC = """#!/bin/sh
echo "$@" >> "{log}"
if [ -n "$FAKE_CC_FAIL" ]; then echo "error: $FAKE_CC_FAIL" >&2; exit 1; fi
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then echo object > "$2"; fi
  shift
done
"""


def _fake_cc(tmp_path: Path) -> tuple[str, Path]:
    log = tmp_path / "cc.log"
    cc = tmp_path / "fake-cc"
    cc.write_text(FAKE_CC.format(log=log))
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    return str(cc), log


def _copy_sources(dest: Path) -> Path:
    shutil.copytree(build.SRC_DIR, dest, ignore=shutil.ignore_patterns("*.so", "__pycache__", ".build-*"))
    return dest


@pytest.fixture
def fresh_backend(monkeypatch):
    """qgemv as in a new process: no backend chosen yet (the real one is back after the test)."""
    monkeypatch.setattr(qgemv, "_backend", None)
    monkeypatch.setattr(qgemv, "_lib", None)
    monkeypatch.setattr(qgemv, "_why", "")
    yield
    monkeypatch.undo()


def test_the_key_names_the_sources_and_flags_not_where_they_are(tmp_path, monkeypatch):
    a, b = _copy_sources(tmp_path / "a"), _copy_sources(tmp_path / "elsewhere" / "b")
    assert build.source_key(a) == build.source_key(b) == build.source_key()
    (b / "finite.c").write_text((b / "finite.c").read_text() + "\n/* an edit */\n")
    assert build.source_key(b) != build.source_key(a)
    before = build.source_key(a)
    monkeypatch.setitem(build.ISA_FLAGS, "avx2", ["-mavx2"])
    assert build.source_key(a) != before


def test_a_build_compiles_each_variant_links_them_and_reports_its_steps(tmp_path):
    cc, log = _fake_cc(tmp_path)
    seen: list[tuple[str, float]] = []
    out = tmp_path / "out" / build.LIB_NAME
    key = build.compile_library(cc, out, build.SRC_DIR, lambda what, f: seen.append((what, f)))
    assert key == build.source_key() and out.read_text() == "object\n"
    calls = log.read_text().splitlines()
    assert len(calls) == len(build.isas()) + 3  # pool, dispatch, one isa.c per variant; the link
    assert [c for c in calls if "DS4K_SOURCE_KEY" in c] == [c for c in calls if "dispatch.c" in c]
    assert f'-DDS4K_SOURCE_KEY="{key}"' in next(c for c in calls if "dispatch.c" in c).split()
    assert "-shared" in calls[-1] and str(build.SRC_DIR.parent) not in key
    fractions = [f for _, f in seen]
    assert {w for w, _ in seen} == {build.WHAT} and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert fractions == sorted(fractions)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".build-")]  # its work dir is gone


def test_a_compiler_error_is_raised_with_the_compilers_words(tmp_path, monkeypatch):
    cc, _ = _fake_cc(tmp_path)
    monkeypatch.setenv("FAKE_CC_FAIL", "unknown type name 'vec'")
    out = tmp_path / "out" / build.LIB_NAME
    with pytest.raises(RuntimeError, match="unknown type name 'vec'"):
        build.compile_library(cc, out, build.SRC_DIR)
    assert list(out.parent.iterdir()) == []  # nothing half-written left


def test_the_loaded_library_carries_the_key_of_these_sources(kernels):
    assert qgemv.source_key_of(kernels) == build.source_key()


def test_an_installed_library_of_these_sources_runs_with_no_compiler(kernels, fresh_backend, tmp_path, monkeypatch):
    installed = tmp_path / "site-packages" / build.LIB_NAME
    installed.parent.mkdir()
    shutil.copy(kernels._name, installed)
    monkeypatch.setattr(qgemv, "PREBUILT", installed)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    assert qgemv.backend() != "torch", qgemv.backend_reason()
    assert qgemv.library()._name == str(installed)
    assert not (tmp_path / "data").exists()  # nothing compiled, nothing written


def test_an_installed_library_of_other_sources_is_not_used(kernels, fresh_backend, tmp_path, monkeypatch):
    installed = tmp_path / build.LIB_NAME
    shutil.copy(kernels._name, installed)
    monkeypatch.setattr(qgemv, "PREBUILT", installed)
    monkeypatch.setattr(build, "source_key", lambda src_dir=None: "0123456789abcdef")  # the sources were edited
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert qgemv.backend() == "torch"
    assert qgemv.backend_reason() == "the installed kernels are of other sources, and no C compiler (cc/gcc/clang) on PATH"


def test_without_an_installed_library_the_kernels_compile_once_with_progress(kernels, fresh_backend, tmp_path,
                                                                           monkeypatch):
    """The fallback: compiled into the data dir (here by a stand-in that copies the real
    library), reported through progress; the next process finds it there."""
    monkeypatch.setattr(qgemv, "PREBUILT", tmp_path / "none" / build.LIB_NAME)
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    builds: list[Path] = []

    def compile_library(cc, out, src_dir, progress=None):
        builds.append(out)
        progress(build.WHAT, 0.0)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(kernels._name, out)
        progress(build.WHAT, 1.0)
        return build.source_key(src_dir)

    monkeypatch.setattr(build, "compile_library", compile_library)
    seen: list[tuple[str, float]] = []
    assert qgemv.prepare(lambda what, f: seen.append((what, f))) != "torch", qgemv.backend_reason()
    assert seen == [(build.WHAT, 0.0), (build.WHAT, 1.0)] and len(builds) == 1
    assert builds[0].parent.parent == tmp_path / "data" / "kernels"
    assert builds[0].parent.name.startswith(build.source_key() + "-")  # the key, then the compiler's
    monkeypatch.setattr(qgemv, "_backend", None)  # a second process
    assert qgemv.prepare(lambda what, f: seen.append((what, f))) != "torch"
    assert len(builds) == 1 and len(seen) == 2


def test_loading_a_model_prepares_the_kernels_first(monkeypatch):
    calls = []
    monkeypatch.setattr(loader, "_LOADED", {})
    monkeypatch.setattr(qgemv, "prepare", lambda progress=None: calls.append(("prepare", progress)))
    monkeypatch.setattr(loader, "_load_uncached", lambda spec, progress=None: calls.append(("load", spec)) or spec)
    report = print
    assert loader.load_model("some-model", progress=report) == "some-model"
    assert calls == [("prepare", report), ("load", "some-model")]


def test_a_saves_finiteness_check_never_starts_a_build(fresh_backend, monkeypatch):
    """Before the kernels are loaded the check runs in numpy: a save must not wait for a compiler."""
    monkeypatch.setattr(qgemv, "_find_library", lambda progress: pytest.fail("a build started inside a save"))
    a = np.ones(1000, np.float16)
    assert payload.all_finite(a)
    a[999] = np.inf
    assert not payload.all_finite(a)
    assert not qgemv.loaded()


@pytest.mark.slow
def test_the_wheel_carries_the_library_of_its_sources(tmp_path):
    """`pip wheel` (the package build, setup.py): the wheel holds libds4k.so built from the
    sources it holds, tagged for any Python 3 on this platform."""
    if build.find_compiler() is None:
        pytest.fail("no C compiler: the package build cannot be tested here")
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside its sources
    shutil.copytree(ROOT / "ds4tui", src / "ds4tui", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env = dict(os.environ, PIP_NO_INDEX="1")  # offline: the build needs only what is installed
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(src)], capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = next(tmp_path.glob("ds4tui-*.whl"))
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl") or "linux" not in sys.platform
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
    kernels = unpacked / "ds4tui" / "engine" / "kernels"
    import ctypes

    lib = ctypes.CDLL(str(kernels / build.LIB_NAME))
    assert qgemv.source_key_of(lib) == build.source_key(kernels) == build.source_key()
