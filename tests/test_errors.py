"""One exception base: every error class of the package derives from `Ds4tuiError`, and the
command line prints any of them as one line (no traceback)."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from ds4tui.cli import main
from ds4tui.errors import Ds4tuiError, error_line

PACKAGE = Path(__file__).resolve().parent.parent / "ds4tui"
BUILTIN_ERRORS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _exception_classes() -> dict[str, tuple[str, set[str]]]:
    """name -> (where, base names) of every class in the package that derives from an exception."""
    classes = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (f"{path.relative_to(PACKAGE.parent)}:{node.lineno}",
                                      {_base_name(b) for b in node.bases})
    exceptions: set[str] = set()
    grew = True
    while grew:  # a class is an exception when one of its bases is
        grew = False
        for name, (_, bases) in classes.items():
            if name not in exceptions and bases & (BUILTIN_ERRORS | exceptions):
                exceptions.add(name)
                grew = True
    return {n: classes[n] for n in exceptions}


def test_every_error_class_derives_from_the_one_base():
    """Private control-flow exceptions (`_Skip`) never leave their module and may stand alone."""
    found = _exception_classes()
    assert {"EngineError", "KvcFormatError", "StoreError", "CliError", "ConfigError"} <= set(found)
    derived = {"Ds4tuiError"}
    grew = True
    while grew:
        grew = False
        for name, (_, bases) in found.items():
            if name not in derived and bases & derived:
                derived.add(name)
                grew = True
    assert [f"{where} {name}" for name, (where, _) in sorted(found.items())
            if name not in derived and not name.startswith("_") and name != "Ds4tuiError"] == []


def test_an_expected_error_is_one_line_a_bug_is_named():
    from ds4tui.engine.errors import WeightsError
    from ds4tui.format.kvc import KvcFormatError

    assert error_line(WeightsError("model.gguf: no tensor blk.0.attn_q")) == "model.gguf: no tensor blk.0.attn_q"
    assert error_line(KeyError("x")) == "KeyError: 'x'"
    assert isinstance(KvcFormatError("bad"), ValueError)  # the other bases stay for their callers


def test_the_cli_prints_any_expected_error_as_one_line(monkeypatch, capsys):
    from ds4tui.cli import models
    from ds4tui.store import StoreError

    def failing(args):
        raise StoreError("conversations.sqlite3: database is locked\x1b[2J")

    monkeypatch.setattr(models, "cmd_list", failing)
    assert main(["models", "list"]) == 1
    assert capsys.readouterr().err == "ds4tui: conversations.sqlite3: database is locked\\e[2J\n"

    def bug(args):
        raise KeyError("a bug keeps its traceback")

    monkeypatch.setattr(models, "cmd_list", bug)
    with pytest.raises(KeyError):
        main(["models", "list"])
    assert issubclass(StoreError, Ds4tuiError)
