"""ds4tui.command: the hints name the command that works where the user is."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ds4tui import command


def _install(root: Path) -> Path:
    """A venv-like bin dir: a python and this package's console script."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    script = bin_dir / "ds4tui"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return bin_dir


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A fresh lookup, run from tmp_path/work with an empty PATH."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    command.prefix.cache_clear()
    yield work
    command.prefix.cache_clear()


def test_a_tool_install_on_path_is_named_plainly(here, tmp_path, monkeypatch):
    """pipx and uv tool link the venv's script into a directory on PATH (~/.local/bin)."""
    venv = _install(tmp_path / "pipx" / "venvs" / "ds4tui")
    linked = tmp_path / "local-bin"
    linked.mkdir()
    (linked / "ds4tui").symlink_to(venv / "ds4tui")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv("PATH", f"{linked}{os.pathsep}/usr/bin")
    assert command.command("models pull x") == "ds4tui models pull x"


def test_make_runs_name_the_checkouts_venv_script(here, monkeypatch):
    venv = _install(here / ".venv")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    assert command.command("models list") == os.path.join(".venv", "bin", "ds4tui") + " models list"


def test_another_ds4tui_on_path_is_not_this_one(here, tmp_path, monkeypatch):
    mine = _install(tmp_path / "elsewhere" / "venv")
    other = _install(tmp_path / "other")
    monkeypatch.setattr(sys, "executable", str(mine / "python"))
    monkeypatch.setenv("PATH", str(other))
    assert command.prefix() == str(mine / "ds4tui")


def test_without_a_script_the_module_is_run_by_this_interpreter(here, tmp_path, monkeypatch):
    bare = tmp_path / "python-only" / "bin"
    bare.mkdir(parents=True)
    (bare / "python3").symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(bare / "python3"))
    assert command.prefix() == f"{bare / 'python3'} -m ds4tui"
