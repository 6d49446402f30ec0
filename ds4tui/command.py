"""The command that runs this ds4tui, for the hints messages give ("run `... models pull X`").

`ds4tui` when that name on PATH is this install (pipx, uv tool, an activated venv); else this
install's own script by its path (`.venv/bin/ds4tui` under `make run`, relative when it lies
below the current directory); else this interpreter with `-m ds4tui`. A hint then works
where the user is, pasted as it is.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

NAME = "ds4tui"


def _shown(path: Path) -> str:
    """`path` as a user would type it: relative below the current directory, else absolute."""
    try:
        rel = path.relative_to(Path.cwd())
    except ValueError:
        return str(path)
    return str(rel) if str(rel) != "." else str(path)


@functools.cache
def prefix() -> str:
    """How to start ds4tui here (cached: PATH and the install do not change while it runs)."""
    bin_dir = Path(sys.executable).parent  # not resolved: a venv's python is a link out of it
    script = bin_dir / NAME
    on_path = shutil.which(NAME)
    mine = script.is_file() and os.access(script, os.X_OK)
    if on_path and mine and Path(on_path).resolve() == script.resolve():
        return NAME
    if mine:
        return _shown(script)
    return f"{_shown(Path(sys.executable))} -m {NAME}"


def command(args: str) -> str:
    """`prefix() args`: e.g. command("models pull smollm2-135m-instruct")."""
    return f"{prefix()} {args}"
