"""Where ds4tui keeps things on disk (platformdirs), and the environment overrides.

| what | default | override |
|---|---|---|
| KV cache | user_cache_dir("ds4tui")/kv | --dir / --cache-dir, DS4TUI_CACHE_DIR |
| models | user_data_dir("ds4tui")/models | DS4TUI_DATA_DIR (parent of models/) |
| config | user_config_dir("ds4tui")/config.toml | DS4TUI_CONFIG |
| remote transcripts (before the store; imported) | user_data_dir("ds4tui")/transcripts | DS4TUI_TRANSCRIPTS_DIR |
| conversation store | user_data_dir("ds4tui")/conversations.sqlite3 | --data-dir, DS4TUI_STORE (the file) |
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "ds4tui"


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The KV cache directory: explicit override, then $DS4TUI_CACHE_DIR, then platformdirs."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("DS4TUI_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "kv"


def data_dir() -> Path:
    """Root of downloaded models and converted weights."""
    env = os.environ.get("DS4TUI_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir(APP_NAME))


def models_dir() -> Path:
    return data_dir() / "models"


def config_path() -> Path:
    env = os.environ.get("DS4TUI_CONFIG")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def transcripts_dir() -> Path:
    """Where the chat keeps conversations held with remote engines (--engine)."""
    env = os.environ.get("DS4TUI_TRANSCRIPTS_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir(APP_NAME)) / "transcripts"


STORE_FILE = "conversations.sqlite3"


def store_path(data_dir: str | os.PathLike | None = None) -> Path:
    """The conversation store (every chat's history): `data_dir`/conversations.sqlite3 when a
    directory is given (--data-dir, config `data_dir`), else $DS4TUI_STORE, else the user data dir."""
    if data_dir:
        return Path(data_dir).expanduser() / STORE_FILE
    env = os.environ.get("DS4TUI_STORE")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir(APP_NAME)) / STORE_FILE
