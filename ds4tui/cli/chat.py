"""`ds4tui` with no command: the chat. Flags mirror the config file's keys."""

from __future__ import annotations

import argparse


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model spec: a name from `ds4tui models list`, a GGUF file or a checkpoint directory")
    parser.add_argument("--cache-dir", help="KV cache directory (default: platformdirs cache dir /kv, or $DS4TUI_CACHE_DIR)")
    parser.add_argument("--budget-mb", type=int, help="disk budget of the KV cache in MiB (default 4096)")
    parser.add_argument("--ctx", type=int, help="context size in tokens")
    parser.add_argument("--resume", metavar="SHA_PREFIX_OR_TITLE", help="open a saved session")
    parser.add_argument("--no-disk-cache", action="store_true", help="do not read or write .kv files")


def run_chat(args: argparse.Namespace) -> int:
    from ds4tui.cli import CliError

    raise CliError("the chat UI is not built yet; try `ds4tui kv ls` or `ds4tui --help`")
