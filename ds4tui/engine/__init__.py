"""The inference engine: the Model/Session contract, loading, sampling, text, one package per family.

    from ds4tui.engine import load_model, Model, Session, EngineError

The names are resolved on first use (PEP 562), so importing a submodule such as
`ds4tui.engine.registry` does not load torch: `ds4tui models list` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "load_model": "ds4tui.engine.loader",
    "Model": "ds4tui.engine.model",
    "ModelInfo": "ds4tui.engine.model",
    "Session": "ds4tui.engine.session",
    "EngineError": "ds4tui.engine.errors",
    "WeightsError": "ds4tui.engine.errors",
    "ModelNotFoundError": "ds4tui.engine.errors",
    "ContextFullError": "ds4tui.engine.errors",
    "PayloadError": "ds4tui.engine.errors",
}
__all__ = [
    "ContextFullError",
    "EngineError",
    "Model",
    "ModelInfo",
    "ModelNotFoundError",
    "PayloadError",
    "Session",
    "WeightsError",
    "load_model",
]

if TYPE_CHECKING:
    from ds4tui.engine.errors import (
        ContextFullError, EngineError, ModelNotFoundError, PayloadError, WeightsError,
    )
    from ds4tui.engine.loader import load_model
    from ds4tui.engine.model import Model, ModelInfo
    from ds4tui.engine.session import Session


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ds4tui.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
