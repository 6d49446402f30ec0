"""The chat's settings: defaults, the TOML config file, and command-line overrides.

Owns: the `Config` record, reading `paths.config_path()` (TOML, flat keys, read
with tomllib), checking every value's type and range with a message that names
the key, applying CLI flags on top, and writing the file back from the
settings screen. Leaves to callers: what the settings mean (controller, engine).

Example `config.toml`:

    model = "smollm2-135m-instruct"
    budget_mb = 4096
    temperature = 0.7
    max_tokens = 1024
    system_prompt = "You are a concise assistant."
    theme = "gruvbox"          # the palette's "Change theme" writes it

    [system_prompts]           # presets: palette "System prompt: NAME", and the F3 dialog
    terse = "Answer in one sentence."
    "code review" = "You review code: point out bugs first, then style."

The chat changes this file only through `config_file.update_config_file`, which edits
the keys it sets in place and keeps the user's comments and other lines.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from ds4tui import paths
from ds4tui.engine.defaults import DEFAULT_MODEL
from ds4tui.errors import Ds4tuiError
from ds4tui.format.swa_policy import check_policy_text


class ConfigError(Ds4tuiError, ValueError):
    """The config file (or a flag) holds a value that cannot be used; the message names the key."""


@dataclass(frozen=True)
class Config:
    """Every setting of the chat. `None` means "the engine's or the template's default"."""

    model: str = DEFAULT_MODEL
    cache_dir: str | None = None  # None: paths.cache_dir() (env or platformdirs)
    # Where the conversation store (conversations.sqlite3, every chat's history) lives;
    # None: paths.store_path() ($DS4TUI_STORE or the user data dir).
    data_dir: str | None = None
    # Where the chat's "Export chat" writes NAME.md and NAME.json; None: paths.export_dir()
    # (the documents dir's ds4tui folder, else the data dir's exports/).
    export_dir: str | None = None
    budget_mb: int = 4096  # disk budget of the KV cache directory (ds4's default)
    ctx: int | None = None  # context size of each session; None: the model's default
    temperature: float = 0.7
    top_p: float = 0.95
    min_p: float = 0.05
    max_tokens: int = 1024  # per assistant turn
    system_prompt: str | None = None  # None: the chat template's own default system prompt
    no_disk_cache: bool = False
    # Live engine sessions kept in memory at once. Each one holds static KV
    # buffers for its whole context (SmolLM2 at 8K ctx: ~380 MB fp32), so the
    # cap is what bounds memory; the least recently used one goes to disk.
    live_sessions: int = 4
    seed: int | None = None  # sampling seed; None: fresh randomness per turn
    # What DSV4-family checkpoints store of the sliding window: "full", "periodic:K" or
    # "zero" (ds4tui/format/swa_policy.py, docs/swa_policies.md). Other families ignore it.
    swa_policy: str = "full"
    # Type of a llama-family session's K/V: "f16" (half the memory and disk of "f32", as
    # llama.cpp's default cache) or "f32". A cache file is only read by sessions of its own type.
    # DSV4 ignores it (its cache_f16 option is part of the checkpoint's config).
    kv_dtype: str = "f16"
    # How often a growing conversation is checkpointed (`continued` files): every this many
    # tokens, rounded up to the alignment (ds4's 10000 and 2048: a file every 10240 tokens),
    # so a kill -9 of the chat or the server loses at most one interval. 0: never.
    continued_interval_tokens: int = 10000
    checkpoint_align_tokens: int = 2048
    # The Textual theme (the palette's "Change theme" saves it); None: Textual's default.
    theme: str | None = None
    # Named system prompts ([system_prompts] table): offered in the palette and the F3 dialog.
    system_prompts: dict[str, str] = field(default_factory=dict)

    def cache_path(self) -> Path:
        return paths.cache_dir(self.cache_dir)

    def cache_policy(self):
        """The disk cache's policy with this config's budget and checkpoint interval."""
        from ds4tui.cache.policy import CachePolicy

        return CachePolicy(budget_mb=self.budget_mb, continued_interval_tokens=self.continued_interval_tokens,
                           boundary_align_tokens=self.checkpoint_align_tokens)


# key -> (accepted python types, checker(value) -> error text or None)
_CHECKS: dict[str, tuple[tuple[type, ...], Any]] = {
    "model": ((str,), lambda v: None if v.strip() else "must not be empty"),
    "cache_dir": ((str,), lambda v: None if v.strip() else "must not be empty"),
    "data_dir": ((str,), lambda v: None if v.strip() else "must not be empty"),
    "export_dir": ((str,), lambda v: None if v.strip() else "must not be empty"),
    "budget_mb": ((int,), lambda v: None if v > 0 else "must be > 0"),
    "ctx": ((int,), lambda v: None if v > 0 else "must be > 0"),
    "temperature": ((int, float), lambda v: None if 0 <= v <= 5 else "must be within 0..5"),
    "top_p": ((int, float), lambda v: None if 0 < v <= 1 else "must be within (0, 1]"),
    "min_p": ((int, float), lambda v: None if 0 <= v < 1 else "must be within [0, 1)"),
    "max_tokens": ((int,), lambda v: None if v > 0 else "must be > 0"),
    "system_prompt": ((str,), lambda v: None),
    "no_disk_cache": ((bool,), lambda v: None),
    "live_sessions": ((int,), lambda v: None if v >= 1 else "must be >= 1"),
    "seed": ((int,), lambda v: None if v >= 0 else "must be >= 0"),
    "swa_policy": ((str,), check_policy_text),
    "kv_dtype": ((str,), lambda v: None if v in ("f16", "f32") else 'must be "f16" or "f32"'),
    "continued_interval_tokens": ((int,), lambda v: None if v >= 0 else "must be >= 0 (0: no continued checkpoints)"),
    # A multiple of 64 keeps checkpoints on the engines' prefill chunk boundaries.
    "checkpoint_align_tokens": ((int,), lambda v: None if v > 0 and v % 64 == 0 else "must be a positive multiple of 64"),
    "theme": ((str,), lambda v: None if v.strip() else "must not be empty"),
    "system_prompts": ((dict,), lambda v: _check_presets(v)),
}
_FLOAT_KEYS = {"temperature", "top_p", "min_p"}


MAX_PRESET_NAME = 60


def check_preset_name(name: object) -> str | None:
    """Why `name` cannot name a system prompt preset, or None."""
    if not isinstance(name, str) or not name.strip():
        return "a preset name must not be empty"
    if len(name) > MAX_PRESET_NAME:
        return f"a preset name must be at most {MAX_PRESET_NAME} characters"
    if any(ch in name for ch in "\n\r\t") or name != name.strip():
        return "a preset name is one line with no spaces around it"
    return None


def _check_presets(presets: dict) -> str | None:
    for name, text in presets.items():
        problem = check_preset_name(name)
        if problem:
            return f"{problem} (got {name!r})"
        if not isinstance(text, str):
            return f"entry {name!r} must be a string, got {type(text).__name__}"
    return None


def check_value(key: str, value: Any, where: str = "config") -> Any:
    """The value, converted (int -> float where a float is meant), or ConfigError naming the key."""
    if key not in _CHECKS:
        known = ", ".join(sorted(_CHECKS))
        raise ConfigError(f"{where}: unknown key {key!r} (known keys: {known})")
    types, check = _CHECKS[key]
    # bool is an int subclass in Python; only no_disk_cache takes a bool.
    if isinstance(value, bool) and bool not in types:
        raise ConfigError(f"{where}: {key} must be {' or '.join(t.__name__ for t in types)}, not a boolean")
    if not isinstance(value, types):
        raise ConfigError(f"{where}: {key} must be {' or '.join(t.__name__ for t in types)}, got {type(value).__name__}")
    if key in _FLOAT_KEYS:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {key} must be a finite number")
    problem = check(value)
    if key == "system_prompts":
        value = dict(value)
    if problem:
        shown = "" if key == "system_prompts" else f" (got {value!r})"
        raise ConfigError(f"{where}: {key} {problem}{shown}")
    return value


def from_mapping(data: Mapping[str, Any], where: str = "config") -> Config:
    """A Config from flat key/values (a parsed TOML table); unknown keys are errors, not ignored."""
    values = {key: check_value(key, value, where) for key, value in data.items()}
    return replace(Config(), **values)


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read the config file; a missing file gives the defaults, a bad one raises ConfigError."""
    file = Path(path) if path is not None else paths.config_path()
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read ({exc.strerror or exc})") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{file}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML ({exc})") from None
    return from_mapping(data, where=str(file))


def with_overrides(config: Config, **flags: Any) -> Config:
    """Config with every flag that is not None applied (the CLI passes its parsed args)."""
    values = {key: check_value(key, value, "command line") for key, value in flags.items() if value is not None}
    return replace(config, **values)


def dumps(config: Config) -> str:
    """TOML text holding the settings that differ from the defaults."""
    defaults = Config()
    lines = ["# ds4tui settings (see `ds4tui --help`); command-line flags override them."]
    for f in fields(Config):
        value = getattr(config, f.name)
        if value == getattr(defaults, f.name) or value is None or isinstance(value, dict):
            continue
        lines.append(f"{f.name} = {_toml_value(value)}")
    if config.system_prompts:
        lines += ["", "[system_prompts]"]
        lines += [f"{toml_key(name)} = {_toml_value(text)}" for name, text in config.system_prompts.items()]
    return "\n".join(lines) + "\n"


def save_config(config: Config, path: str | os.PathLike | None = None) -> Path:
    """Write the config file atomically (tmp + rename); returns its path."""
    file = Path(path) if path is not None else paths.config_path()
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(dumps(config), encoding="utf-8")
    os.replace(tmp, file)
    return file


def toml_key(name: str) -> str:
    """A key as TOML writes it: bare when it can be, else a quoted string."""
    return name if name and all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in name) else _toml_value(name)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # A JSON string literal is a valid TOML basic string: same escapes (\" \\ \n \t \uXXXX).
    # TOML also wants DEL escaped, which JSON leaves alone.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def as_dict(config: Config) -> dict[str, Any]:
    return asdict(config)
