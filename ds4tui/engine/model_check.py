"""Whether a model spec can be loaded, told before the chat's UI opens: one line naming the file and why.

Owns `check_model(spec)`: the spec resolved the way `loader.load_model` resolves it (a
registered name, a `.gguf` file, a checkpoint directory), then what can be checked without
loading weights or importing torch: a GGUF's header walked and every tensor found inside the
file (llama/gguf_meta.py: a text file named .gguf, a download cut short), a directory's
config.json and its model type. A GGUF that passed is remembered by (path, size, mtime) under
the data dir, so an unchanged model costs a stat at the next start (the walk takes 0.2-0.6 s
on a 260k-token vocabulary). What only the load can find (a key of the wrong type, a tensor
of the wrong shape) the chat still reports when the load fails.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from pathlib import Path

from ds4tui import paths
from ds4tui.engine.errors import ModelNotFoundError, WeightsError

DSV4_MODEL_TYPES = {"deepseek_v4", "deepseek-v4", "dsv4"}
LLAMA_MODEL_TYPES = {"llama", "mistral", "smollm", "smollm2", "qwen2", "qwen3", "gemma3_text"}
BUILT_ON_FIRST_USE = ("tiny-llama", "tiny-dsv4")  # seeded test models, no file until then
CHECK_VERSION = 1  # bump when the check finds more: files passed by an older one are checked again


def resolve(spec: str) -> Path | None:
    """The file or directory `spec` names (None for a model built on first use); raises
    ModelNotFoundError for a name that is neither a path nor a registered model."""
    if spec in BUILT_ON_FIRST_USE:
        return None
    path = Path(spec).expanduser()
    if path.exists():
        return path
    from ds4tui.engine.registry import resolve_registered

    registered = resolve_registered(spec)  # raises ModelNotFoundError naming the pull command
    if registered is None:
        from ds4tui.command import command

        raise ModelNotFoundError(
            f"unknown model {spec!r}: not a file, a directory or a name from `{command('models list')}`")
    return registered


def check_model(spec: str) -> None:
    """Raise ModelNotFoundError or WeightsError (one line, naming the file) when `spec` cannot be
    loaded for a reason its files show."""
    path = resolve(spec)
    if path is None:
        return
    if path.is_dir():
        check_checkpoint_dir(path)
    elif path.is_file() and path.suffix == ".gguf":
        check_gguf_file(path)
    elif path.is_file():
        raise ModelNotFoundError(f"{path}: not a model: expected a .gguf file or a checkpoint directory"
                                 " (config.json + *.safetensors)")
    else:
        raise ModelNotFoundError(f"{path}: not a regular file or a directory")


def checkpoint_model_type(path: Path) -> str:
    """The model type (lower case) a checkpoint directory's config.json names; WeightsError when
    there is no readable config.json or no engine here loads that type."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise WeightsError(f"{path}: not a checkpoint directory (no config.json)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{config_file}: unreadable config ({exc})") from None
    model_type = str(config.get("model_type", "")).lower() if isinstance(config, dict) else ""
    if model_type not in DSV4_MODEL_TYPES | LLAMA_MODEL_TYPES:
        raise WeightsError(f"{config_file}: model_type {model_type!r} is not supported (llama family or deepseek_v4)")
    return model_type


def check_checkpoint_dir(path: Path) -> None:
    checkpoint_model_type(path)
    if not any(path.glob("*.safetensors")):
        raise WeightsError(f"{path}: no *.safetensors weights")


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "check": CHECK_VERSION}


def _memo(path: Path) -> Path:
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return paths.data_dir() / "converted" / "checked" / f"{name}.json"


def check_gguf_file(path: Path) -> None:
    """The header walk and the tensors' extents; remembered once it passed."""
    try:
        stamp = _stamp(path)
    except OSError as exc:
        raise WeightsError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    memo = _memo(path)
    try:
        if json.loads(memo.read_text()) == stamp:
            return
    except (OSError, ValueError):
        pass
    size = stamp["size"]
    if size == 0:
        raise WeightsError(f"{path}: not a GGUF file (empty)")
    from ds4tui.engine.llama.gguf_meta import check_extents, check_layout

    try:
        with open(path, "rb") as fp, mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            layout = check_layout(buf, str(path))
    except OSError as exc:
        raise WeightsError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    from gguf.constants import GGML_QUANT_SIZES  # numpy: only for a file not checked before

    check_extents(layout, size, str(path), {int(k): v for k, v in GGML_QUANT_SIZES.items()})
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stamp))
        os.replace(tmp, memo)
    except OSError:
        pass  # only a memo: the next start checks again
