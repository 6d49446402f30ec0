"""`ds4tui browse [--dir DIR]`: the cache browser alone, without loading a model.

Owns: the command line of the standalone browser. The directory is `--dir`,
else the config file's `cache_dir`, else `paths.cache_dir()`; the budget is
`--budget-mb`, else the config's `budget_mb`. Textual is imported only when
the command runs. Resuming a file from here (enter) closes the browser and
starts the chat on it, as `ds4tui --resume <sha> --cache-dir DIR` would.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ds4tui.cli.errors import CliError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "browse", help="browse the disk KV cache in a terminal UI",
        description="Show every .kv file of a cache directory, decoded and live: pin, delete, rename, "
                    "see what eviction would remove, and resume a conversation in the chat.",
    )
    p.add_argument("--dir", metavar="DIR", help="cache directory (default: config cache_dir, $DS4TUI_CACHE_DIR or platformdirs)")
    p.add_argument("--budget-mb", type=int, metavar="N", help="budget for the gauge and the eviction preview (default: config budget_mb, 4096)")
    p.set_defaults(func=cmd_browse)


def _settings(args) -> tuple[Path, int]:
    from ds4tui import paths
    from ds4tui.config import load_config

    config = load_config()  # a bad file: ConfigError, printed as one line by cli/__init__.py
    if args.dir:
        directory = paths.cache_dir(args.dir)
        # A mistyped --dir must not silently create an empty directory to browse.
        if not directory.is_dir():
            raise CliError(f"{directory} is not a directory")
    else:
        directory = config.cache_path()
    budget = args.budget_mb if args.budget_mb is not None else config.budget_mb
    if budget <= 0:
        raise CliError(f"--budget-mb must be positive, got {budget}")
    return directory, budget


def cmd_browse(args: argparse.Namespace) -> int:
    directory, budget_mb = _settings(args)
    from ds4tui.cache.store import KvStore
    from ds4tui.screens.browse_app import BrowseApp

    from ds4tui.config import load_config

    # The chat's theme (saved by its palette's "Theme"), and a theme picked here is saved too.
    sha = BrowseApp(KvStore(directory, budget_mb=budget_mb), theme=load_config().theme).run()
    if not sha:
        return 0
    from ds4tui.cli import build_parser

    chat_args = build_parser().parse_args(["--resume", sha, "--cache-dir", str(directory)])
    return int(chat_args.func(chat_args) or 0)
