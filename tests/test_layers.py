"""The layer rules of the package layout, checked two ways.

Statically, from every module's source (imports inside functions and under
TYPE_CHECKING count too): who may import whom, as the table in docs/architecture.md
("Layers") says (the table is read from the page, so the page cannot drift from the
rule), and no cycles at all. At run time, in a fresh interpreter: importing a pure layer
loads no torch, Textual or Rich.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ds4tui"
UI_PACKAGES = ("textual", "rich")
# Imports nothing and every layer may import it: the one exception base (ds4tui/errors.py).
SHARED = {"ds4tui.errors"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every absolute module name `path` imports (relative imports resolved). `from pkg import
    sub` counts as importing pkg.sub when that is a module, else pkg itself (its __init__)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists()
                        or (PACKAGE.parent / sub.replace(".", "/") / "__init__.py").exists() else base)
    return out


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _layer_table() -> dict[str, set[str]]:
    """layer -> the layers it may import, from docs/architecture.md's table."""
    text = ARCHITECTURE.read_text()
    rows = text.split("<!-- layers: begin -->")[1].split("<!-- layers: end -->")[0]
    table = {}
    for line in rows.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[1]))
    return table


LAYERS = _layer_table()
GRAPH = {
    name: {m for m in _imports(path) if m in MODULES and m != name}
    for name, path in MODULES.items()
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _offenders(layers: tuple[str, ...], forbidden) -> list[str]:
    bad = []
    for name, path in MODULES.items():
        if _layer(name) in layers:
            bad += [f"{name} imports {m}" for m in sorted(_imports(path)) if m not in SHARED and forbidden(m)]
    return bad


def test_the_shared_modules_import_nothing_of_ours():
    assert [f"{s} imports {m}" for s in SHARED for m in sorted(_imports(MODULES[s])) if m.startswith("ds4tui")] == []


def test_the_architecture_page_has_a_row_for_every_layer():
    """Every package and top module of ds4tui/ is a row; every row is one of them."""
    layers = {_layer(n) for n in MODULES} - {""}
    assert set(LAYERS) == layers
    assert all(allowed <= set(LAYERS) for allowed in LAYERS.values())


def test_every_import_follows_the_architecture_page():
    bad = []
    for name, path in MODULES.items():
        layer = _layer(name)
        allowed = LAYERS.get(layer, set()) | {layer}
        bad += [f"{name} imports {m} ({_layer(m)} is not in {layer}'s row)" for m in sorted(_imports(path))
                if m.startswith("ds4tui.") and m in MODULES and _layer(m) not in allowed]
    assert bad == []


def test_format_imports_nothing_of_ours():
    assert _offenders(("format",), lambda m: m.startswith("ds4tui.") and _layer(m) != "format") == []


def test_cache_imports_only_format():
    assert _offenders(("cache",), lambda m: m.startswith("ds4tui.") and _layer(m) not in ("cache", "format")) == []


def test_store_imports_nothing_of_ours():
    """The conversation store is the record: it depends on no model, cache or UI code."""
    assert _offenders(("store",), lambda m: m.startswith("ds4tui.") and _layer(m) != "store") == []


def test_engine_imports_no_cache_chat_or_screens():
    assert _offenders(("engine",), lambda m: _layer(m) in ("cache", "chat", "screens", "store")
                      and m.startswith("ds4tui.")) == []


def test_only_screens_import_textual_or_rich():
    """The CLI reaches the UI only through ds4tui.screens, inside the command that starts it."""
    outside = tuple(layer for layer in {_layer(n) for n in MODULES} if layer != "screens")
    assert _offenders(outside, lambda m: m.split(".")[0] in UI_PACKAGES) == []


def test_no_import_cycles():
    """Tarjan's strongly connected components over the static graph: none larger than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.parametrize("modules, heavy", [
    (["ds4tui.store", "ds4tui.store.conversations"], ("torch", "textual", "rich")),
    (["ds4tui.format", "ds4tui.format.kvc", "ds4tui.format.payload", "ds4tui.format.swa_policy",
      "ds4tui.format.display"],
     ("torch", "textual", "rich")),
    (["ds4tui.cache", "ds4tui.cache.store", "ds4tui.cache.scan", "ds4tui.cache.watch", "ds4tui.cli.kv",
      "ds4tui.chat.search", "ds4tui.chat.transcript", "ds4tui.cli.imports",
      "ds4tui.chat.history_import", "ds4tui.chat.legacy_transcripts", "ds4tui.cli.chats"],
     ("torch", "textual", "rich")),
    (["ds4tui.chat.controller", "ds4tui.config", "ds4tui.bench.cache_bench"], UI_PACKAGES),
    # chat/remote.py is checked statically only: httpx itself imports rich for its CLI when rich is installed.
    (["ds4tui.serve.app", "ds4tui.serve.main", "ds4tui.serve.worker", "ds4tui.cli.serve"], UI_PACKAGES),
    (["ds4tui.engine", "ds4tui.engine.registry", "ds4tui.cli.models"], ("torch", "textual", "rich")),
    # The chat draws its first frame before the model loads: nothing on that path may need torch.
    (["ds4tui.cli", "ds4tui.cli.chat", "ds4tui.screens.app", "ds4tui.bench.startup_bench"], ("torch",)),
])
def test_pure_layers_load_no_heavy_packages(modules, heavy):
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_engine_package_exports_its_contract():
    from ds4tui.engine import EngineError, Model, Session, load_model
    from ds4tui.engine.loader import load_model as loader_load_model

    assert load_model is loader_load_model and issubclass(EngineError, Exception)
    assert Model.__name__ == "Model" and Session.__name__ == "Session"
