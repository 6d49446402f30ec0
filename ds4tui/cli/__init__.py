"""The `ds4tui` command: `ds4tui [chat flags]` starts the chat; `ds4tui <noun> <verb>` the tools.

Each command group lives in its own module and exposes `register(subparsers)`;
a registered subcommand sets `func(args) -> int` on its parser. Group modules
import heavy packages (torch, textual) only inside their `func`, so `ds4tui kv ls`
starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ds4tui.errors import Ds4tuiError
from ds4tui.format.display import safe_text

# Group modules, in the order `ds4tui --help` lists them.
GROUPS = ["chats", "kv", "models", "bench", "browse", "serve", "imports"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ds4tui",
        description="Terminal chat on an embedded PyTorch engine with a disk KV cache.",
    )
    from ds4tui.cli import chat as chat_cli

    chat_cli.add_chat_arguments(parser)
    parser.set_defaults(func=chat_cli.run_chat)
    # Two forms, as two usage lines: argparse's one line reads as if a COMMAND were required,
    # yet a bare `ds4tui` (flags only) starts the chat.
    chat_usage = parser.format_usage().removeprefix("usage: ").rstrip("\n")
    parser.usage = f"{chat_usage}\n       %(prog)s COMMAND ..."
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", prog=parser.prog)
    for name in GROUPS:
        importlib.import_module(f"ds4tui.cli.{name}").register(sub)
    return parser


def command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser of the deepest command named in `argv`, e.g. `kv ls`'s."""
    for token in argv:
        if token.startswith("-"):
            continue
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or token not in subs[0].choices:
            break
        parser = subs[0].choices[token]
    return parser


def main(argv: list[str] | None = None) -> int:
    # OpenMP worker threads busy-wait after every torch op by default; on the 2 cores this
    # app targets they then compete with the C kernels' own pool (kernels/pool.c) wherever
    # the two alternate, as a short prefill does in every layer (docs/perf-archive.md, "OpenMP wait
    # policy"). Read by libgomp when torch loads it, so set before any torch import; a
    # user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse reports a subcommand's unknown flag with the top-level usage; the
        # usage of the command that was typed (`kv ls`) is the one that helps.
        command_parser(parser, sys.argv[1:] if argv is None else argv).error(
            "unrecognized arguments: " + " ".join(extra))
    try:
        return int(args.func(args) or 0)
    except Ds4tuiError as exc:  # an expected failure (CliError, EngineError, StoreError, ...): one line
        print(f"ds4tui: {safe_text(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ds4tui: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
