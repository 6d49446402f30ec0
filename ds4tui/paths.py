"""Where ds4tui keeps things on disk (platformdirs), and the environment overrides.

| what | default | override |
|---|---|---|
| KV cache | user_cache_dir("ds4tui")/kv | --dir / --cache-dir, DS4TUI_CACHE_DIR |
| models | user_data_dir("ds4tui")/models | DS4TUI_DATA_DIR (parent of models/) |
| config | user_config_dir("ds4tui")/config.toml | DS4TUI_CONFIG |
| remote transcripts (before the store; imported) | user_data_dir("ds4tui")/transcripts | DS4TUI_TRANSCRIPTS_DIR |
| conversation store | user_data_dir("ds4tui")/conversations.sqlite3 | --data-dir, DS4TUI_STORE (the file) |
| exported chats (palette "Export chat") | user_documents_dir()/ds4tui if Documents exists, else user_data_dir("ds4tui")/exports | config `export_dir`, DS4TUI_EXPORT_DIR |
| a copy the terminal may not have taken (no OSC 52) | user_data_dir("ds4tui")/clipboard.txt | DS4TUI_CLIPBOARD_FILE |
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "ds4tui"


def _from_env(variable: str) -> Path | None:
    """The path an environment variable names (`~` expanded), None when it is unset or empty."""
    value = os.environ.get(variable)
    return Path(value).expanduser() if value else None


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The KV cache directory: explicit override, then $DS4TUI_CACHE_DIR, then platformdirs."""
    if override:
        return Path(override).expanduser()
    return _from_env("DS4TUI_CACHE_DIR") or Path(platformdirs.user_cache_dir(APP_NAME)) / "kv"


def data_dir() -> Path:
    """Root of downloaded models and converted weights."""
    return _from_env("DS4TUI_DATA_DIR") or Path(platformdirs.user_data_dir(APP_NAME))


def models_dir() -> Path:
    return data_dir() / "models"


def config_path() -> Path:
    return _from_env("DS4TUI_CONFIG") or Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def transcripts_dir() -> Path:
    """Where the chat keeps conversations held with remote engines (--engine)."""
    return _from_env("DS4TUI_TRANSCRIPTS_DIR") or Path(platformdirs.user_data_dir(APP_NAME)) / "transcripts"


STORE_FILE = "conversations.sqlite3"


def store_path(data_dir: str | os.PathLike | None = None) -> Path:
    """The conversation store (every chat's history): `data_dir`/conversations.sqlite3 when a
    directory is given (--data-dir, config `data_dir`), else $DS4TUI_STORE, else the user data dir."""
    if data_dir:
        return Path(data_dir).expanduser() / STORE_FILE
    return _from_env("DS4TUI_STORE") or Path(platformdirs.user_data_dir(APP_NAME)) / STORE_FILE


def export_dir(override: str | os.PathLike | None = None) -> Path:
    """Where the chat's "Export chat" writes: the config's `export_dir`, then $DS4TUI_EXPORT_DIR,
    then a ds4tui folder in the user's documents dir when that exists, else the data dir's
    exports/. Never the working directory: under `make run` that is the source checkout."""
    if override:
        return Path(override).expanduser()
    env = _from_env("DS4TUI_EXPORT_DIR")
    if env:
        return env
    documents = Path(platformdirs.user_documents_dir())
    if documents.is_dir() and documents != Path.home():  # platformdirs falls back to ~ itself
        return documents / APP_NAME
    return data_dir() / "exports"


def clipboard_file() -> Path:
    """The file a copy is written to where the terminal's clipboard (OSC 52) cannot be relied on."""
    return _from_env("DS4TUI_CLIPBOARD_FILE") or data_dir() / "clipboard.txt"
