"""`ds4tui import FILE.json`: open an exported chat (or any OpenAI messages list) as a new chat.

The file is read and checked here, before the full-screen UI starts (a bad file is one
line on stderr); the chat then opens with the transcript, and its first message
prefills it (or restores the longest cached prefix of it).
"""

from __future__ import annotations

import argparse

from ds4tui.cli.errors import CliError, os_reason
from ds4tui.format.display import safe_text


def register(subparsers) -> None:
    p = subparsers.add_parser("import", help="open a chat exported as JSON (OpenAI messages) as a new chat",
                              description="Open FILE.json ({title, created_at, messages} as `kv export --format json` "
                                          "writes it, or a bare list of OpenAI messages) as a new chat.")
    p.add_argument("file", metavar="FILE.json")
    from ds4tui.cli.chat import add_chat_arguments

    add_chat_arguments(p)
    p.set_defaults(func=cmd_import)


def read_chat_file(path: str) -> tuple[list[dict], str | None, int | None]:
    """(messages, title, created_at) of an exported chat; CliError (one line) when it cannot
    be read or is not one. `ds4tui import` and `ds4tui chats import` both read through here."""
    from ds4tui.chat.transcript import load_json_file

    shown = safe_text(path)
    try:
        return load_json_file(path)
    except OSError as exc:
        raise CliError(f"cannot read {shown}: {os_reason(exc)}") from None
    except UnicodeDecodeError:
        raise CliError(f"cannot import {shown}: not UTF-8 text") from None
    except ValueError as exc:
        raise CliError(f"cannot import {shown}: {exc}") from None


def cmd_import(args: argparse.Namespace) -> int:
    from ds4tui.cli.chat import run_chat

    shown = safe_text(args.file)
    messages, title, created_at = read_chat_file(args.file)
    if not messages:
        raise CliError(f"cannot import {shown}: it holds no messages")
    args.imported = {"messages": messages, "title": title, "created_at": created_at}
    return run_chat(args)
