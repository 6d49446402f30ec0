"""`ds4tui chats`: list, show, export, import, delete and search the chats of the conversation
store, local and remote alike.

Owns the command line over `ds4tui.store` (argument parsing, name resolution, table, text
and JSON output). The store is `--data-dir DIR`/conversations.sqlite3, else the config's
`data_dir`, else `paths.store_path()` ($DS4TUI_STORE or the user data dir); the cache
directory (whether a chat's `.kv` file is still there, the file `rm` deletes, what
`import --from-cache` reads) is `--cache-dir`, else the config's, else `paths.cache_dir()`.
Everything shown that came from the store or a file goes through `format.display`, so
no title or message can drive the terminal; JSON is ASCII-escaped. A chat is named as
`--resume` names it (`ConversationStore.find`: an id prefix, the title, its start).
Reading verbs never create the store file; a store that cannot be opened is one line
and exit status 1. Loads no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from ds4tui.cli.errors import CliError, os_reason
from ds4tui.config import load_config  # a bad file: ConfigError, one line (cli/__init__.py)
from ds4tui.format.display import local_time, relative_time, safe_lines, safe_text

ID_CHARS = 12  # the id prefix shown: `find` takes 4 or more


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", metavar="DIR",
                        help="the store is DIR/conversations.sqlite3 (default: config data_dir, $DS4TUI_STORE or "
                             "the user data dir)")
    common.add_argument("--cache-dir", metavar="DIR",
                        help="KV cache directory (default: config cache_dir, $DS4TUI_CACHE_DIR or platformdirs)")
    chats = subparsers.add_parser(
        "chats", help="list, show, export, import, delete and search stored chats",
        description="Every chat's history lives in the conversation store (a SQLite file); these verbs work on it. "
                    "A chat is named by its id prefix (4+ characters, see `chats ls`), its title or the start of it.")
    chats.set_defaults(func=cmd_ls, data_dir=None, cache_dir=None, json=False, archived=False)
    verbs = chats.add_subparsers(title="commands", metavar="VERB")

    p = verbs.add_parser("ls", parents=[common], help="one row per chat, most recently used first (default)",
                         description="One row per chat: id prefix, last use, messages (the system prompt not counted), "
                                     "cache (kv: its .kv file is in the cache directory, so it resumes without a "
                                     "prefill; text only: the history alone, re-prefilled when continued), engine, "
                                     "model, title.")
    p.add_argument("--archived", action="store_true", help="the archived chats instead")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of {id, title, model, engine, messages, created_at, updated_at, kv_sha, "
                        "kv_tokens, kv, archived}")
    p.set_defaults(func=cmd_ls)

    p = verbs.add_parser("show", parents=[common], help="print a chat's messages",
                         description="Print the chat's shown messages (the branch it opens on), with its details.")
    p.add_argument("query", metavar="ID_OR_TITLE")
    p.set_defaults(func=cmd_show)

    p = verbs.add_parser("export", parents=[common], help="a chat as Markdown or JSON (OpenAI messages)",
                         description="Export the chat's shown messages: Markdown, or JSON {title, created_at, last_used, "
                                     "sha, messages, id, model, engine} (`ds4tui import` and `chats import` read it).")
    p.add_argument("query", metavar="ID_OR_TITLE")
    p.add_argument("--format", choices=("md", "json"), default="md", help="md (default) or json")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=cmd_export)

    p = verbs.add_parser("import", parents=[common], help="add a chat from a JSON export, or the chats of the cache",
                         description="Add FILE.json (as `chats export --format json` or `kv export` writes it, or a "
                                     "bare OpenAI messages list) to the store as a new chat; or, with --from-cache, "
                                     "every titled .kv session of the cache directory and every remote transcript "
                                     "($DS4TUI_TRANSCRIPTS_DIR) not imported yet (what the chat does at start).")
    p.add_argument("file", metavar="FILE.json", nargs="?")
    p.add_argument("--from-cache", action="store_true", help="import the cache directory's titled sessions")
    p.set_defaults(func=cmd_import)

    p = verbs.add_parser("rm", parents=[common], help="delete a chat and its .kv file",
                         description="Delete the chat (every message and version) and its titled .kv file.")
    p.add_argument("query", metavar="ID_OR_TITLE")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask (not even for a pinned .kv file)")
    p.set_defaults(func=cmd_rm)

    p = verbs.add_parser("grep", parents=[common], help="find chats by title or message (every branch)",
                         description="Chats whose title or any message (every version) contains PATTERN, "
                                     "case-insensitively; one line per chat, most recently used first.")
    p.add_argument("pattern", metavar="PATTERN", help="text to find (a regular expression with --regex)")
    p.add_argument("--regex", action="store_true", help="PATTERN is a regular expression")
    p.add_argument("--json", action="store_true", help="print a JSON list of {id, title, where, snippet}")
    p.set_defaults(func=cmd_grep)


# -- the store, the cache directory, one chat ---------------------------------------------


def store_file(args) -> Path:
    from ds4tui import paths

    return paths.store_path(args.data_dir or getattr(load_config(), "data_dir", None))


def _cache_dir(args) -> Path:
    from ds4tui import paths

    return paths.cache_dir(args.cache_dir) if args.cache_dir else load_config().cache_path()


@contextlib.contextmanager
def _opened(args, *, create: bool):
    """The store for the `with` block (closed after it), or None when its file does not exist
    and `create` is off (nothing stored yet); CliError (one line) when the file cannot be used."""
    from ds4tui.store import open_store

    path = store_file(args)
    if not create and not path.exists():
        yield None
        return
    store = open_store(path)
    try:
        if store.notice:
            # The notice goes on to what the chat does about it (an in-memory store): not so here.
            raise CliError(store.notice.split("; this session")[0])
        yield store
    finally:
        store.close()


def _the_chat(args):
    """The one stored chat `args.query` names, read whole (the store is closed again)."""
    with _opened(args, create=False) as store:
        return _one(store, args.query)


def _one(store, query: str):
    """The one chat `query` names (archived ones too); CliError listing the candidates else."""
    found = store.find(query) if store is not None else []
    if not found:
        where = safe_text(str(store.path)) if store is not None else "the store (no chat stored yet)"
        raise CliError(f"no chat matches {query!r} in {where} (see `ds4tui chats ls`)")
    if len(found) > 1:
        names = "; ".join(f"{c.id[:ID_CHARS]} {safe_text(c.display_title, 40)}" for c in found[:8])
        raise CliError(f"ambiguous: {len(found)} chats match {query!r}: {names}"
                       f"{'; ...' if len(found) > 8 else ''}")
    return store.load(found[0].id)


def _kv_state(chat, cache_dir: Path) -> str:
    """"kv" when the chat's titled .kv file is in the cache directory, else "text only"."""
    from ds4tui.format.kvc import kv_name

    return "kv" if chat.kv_sha and (cache_dir / kv_name(chat.kv_sha)).is_file() else "text only"


def _engine(chat) -> str:
    return "local" if not chat.remote else (urlsplit(chat.engine).netloc or chat.engine)


def _model(chat) -> str:
    """A model spec as short as it reads: a file or directory by its name."""
    return Path(chat.model).name if "/" in chat.model else (chat.model or "?")


def _shown_messages(chat) -> int:
    """Messages on the shown path, the system prompt not counted."""
    return chat.message_count - (1 if chat.system_prompt is not None and chat.message_count else 0)


def _one_line_store_errors(command):
    """A StoreError (the file went bad, or is locked by a long write) as the CLI's one line."""
    import functools

    @functools.wraps(command)
    def run(args) -> int:
        from ds4tui.store import StoreError

        try:
            return command(args)
        except StoreError as exc:
            raise CliError(str(exc)) from None

    return run


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2))


# -- ls -------------------------------------------------------------------------------------


@_one_line_store_errors
def cmd_ls(args) -> int:
    with _opened(args, create=False) as store:
        chats = store.list(archived=args.archived) if store is not None else []
    cache_dir = _cache_dir(args)
    if args.json:
        _print_json([{"id": c.id, "title": c.title, "model": c.model, "engine": c.engine,
                      "messages": _shown_messages(c), "created_at": c.created_at, "updated_at": c.updated_at,
                      "kv_sha": c.kv_sha, "kv_tokens": c.kv_tokens, "kv": _kv_state(c, cache_dir),
                      "archived": c.archived} for c in chats])
        return 0
    if not chats:
        what = "archived chats" if args.archived else "chats"
        missing = "" if store is not None else " (no history file yet: the chat creates it)"
        print(f"no {what} in {safe_text(str(store_file(args)))}{missing}")
        return 0
    for line in ls_lines(chats, time.time(), shutil.get_terminal_size().columns, cache_dir):
        print(line)
    print(f"{len(chats)} {'archived ' if args.archived else ''}chat(s) in {safe_text(str(store_file(args)))}")
    return 0


def ls_lines(chats, now: float, columns: int, cache_dir: Path) -> list[str]:
    """The table: fixed columns, then the title as wide as the terminal leaves (at least 14)."""
    models = [safe_text(_model(c), 28) for c in chats]
    engines = [safe_text(_engine(c), 24) for c in chats]
    model_w = max(len("MODEL"), *(len(m) for m in models))
    engine_w = max(len("ENGINE"), *(len(e) for e in engines))
    fixed = ID_CHARS + 1 + 8 + 1 + 4 + 1 + 9 + 1 + engine_w + 1 + model_w + 1
    title_w = max(14, columns - fixed - 1)

    def row(chat_id, used, msgs, cache, engine, model, title) -> str:
        return (f"{chat_id:<{ID_CHARS}} {used:<8} {msgs:>4} {cache:<9} {engine:<{engine_w}} {model:<{model_w}} "
                f"{title}").rstrip()

    out = [row("ID", "USED", "MSGS", "CACHE", "ENGINE", "MODEL", "TITLE")]
    for c, model, engine in zip(chats, models, engines):
        title = safe_text(c.display_title)
        title = title if len(title) <= title_w else title[:title_w - 1] + "…"
        out.append(row(c.id[:ID_CHARS], relative_time(int(c.updated_at), now, never="-"), _shown_messages(c),
                       _kv_state(c, cache_dir), engine, model, title))
    return out


# -- show / export ----------------------------------------------------------------------------


@_one_line_store_errors
def cmd_show(args) -> int:
    chat = _the_chat(args)
    kv = _kv_state(chat, _cache_dir(args))
    print(safe_text(chat.display_title))
    details = [f"id {chat.id}", f"model {safe_text(chat.model or '?')}", f"engine {safe_text(chat.engine)}",
               f"{_shown_messages(chat)} messages", f"created {local_time(chat.created_at)}",
               f"last used {local_time(chat.updated_at)}",
               f"{kv} ({chat.kv_sha[:10]}, {chat.kv_tokens} tokens)" if kv == "kv" else kv]
    if chat.archived:
        details.append("archived")
    print(" · ".join(details))
    for index, m in enumerate(chat.messages):
        versions = chat.alternatives.get(index)
        which = ""
        if versions and m["content"] in versions:
            which = f" (version {versions.index(m['content']) + 1} of {len(versions)})"
        print()
        print(f"[{m['role']}]{which}")
        print(safe_lines(m["content"]))
    return 0


@_one_line_store_errors
def cmd_export(args) -> int:
    from ds4tui.chat import transcript
    from ds4tui.cli.kv import write_or_print

    chat = _the_chat(args)
    created, used = int(chat.created_at), int(chat.updated_at)
    if args.format == "json":
        data = transcript.to_json(chat.messages, chat.title, created, used, chat.kv_sha)
        data.update(id=chat.id, model=chat.model, engine=chat.engine)
        out = json.dumps(data, indent=2) + "\n"
    else:
        out = transcript.to_markdown(chat.messages, chat.title, created, used)
    write_or_print(out, args.output, as_json=args.format == "json")
    return 0


# -- import -------------------------------------------------------------------------------------


@_one_line_store_errors
def cmd_import(args) -> int:
    if bool(args.file) == bool(args.from_cache):
        raise CliError("chats import takes FILE.json or --from-cache (one of them)")
    if args.from_cache:
        return _import_cache(args)
    from ds4tui.cli.imports import read_chat_file

    shown = safe_text(args.file)
    messages, title, created_at = read_chat_file(args.file)
    if not any(m["role"] == "user" for m in messages):
        raise CliError(f"cannot import {shown}: it holds no user message")
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    with _opened(args, create=True) as store:
        chat_id = store.create(title=title, system_prompt=system, created_at=created_at, messages=messages)
    print(f"imported {chat_id[:ID_CHARS]} {safe_text(title or 'New chat', 60)} ({len(messages)} messages)")
    return 0


def _import_cache(args) -> int:
    from ds4tui import paths
    from ds4tui.chat.history_import import import_existing

    with _opened(args, create=True) as store:
        report = import_existing(store, _cache_dir(args), paths.transcripts_dir())
    for path, why in report.skipped:
        print(f"skipped {safe_text(path)}: {safe_text(why)}", file=sys.stderr)
    print(f"imported {report.imported} chat(s); {report.already} already in the store"
          + (f"; {len(report.skipped)} file(s) skipped" if report.skipped else ""))
    if report.error:
        raise CliError(f"the import stopped: {report.error}")
    return 0


# -- rm -------------------------------------------------------------------------------------------


@_one_line_store_errors
def cmd_rm(args) -> int:
    from ds4tui.cache import KvStore

    with _opened(args, create=False) as store:
        chat = _one(store, args.query)
        name = f"{chat.id[:ID_CHARS]} {safe_text(chat.display_title, 60)}"
        if not args.yes and not _confirm(f"delete {name} ({_shown_messages(chat)} messages)"
                                         f"{' and its .kv file' if chat.kv_sha else ''}? [y/N] "):
            print("nothing deleted")
            return 1
        # A pinned file is never deleted on one "yes" (the chat's and the cache browser's rule).
        if not args.yes and chat.kv_sha and _pinned(_cache_dir(args), chat.kv_sha) and not _confirm(
                "its .kv file is PINNED: it was kept on purpose and eviction never removes it. Delete it anyway? [y/N] "):
            print("nothing deleted")
            return 1
        # The .kv file first: a titled file left behind by a chat that is gone would come back
        # as a chat at the next start's import; a chat left with no file only re-prefills.
        if chat.kv_sha:
            kv = KvStore(_cache_dir(args))
            try:
                kv.delete(chat.kv_sha)
            except OSError as exc:
                raise CliError(f"{name}: cannot remove its .kv file {kv.path_for(chat.kv_sha)}: "
                               f"{os_reason(exc)}; nothing deleted") from None
        store.delete(chat.id)
    print(f"deleted {name}")
    return 0


def _pinned(cache_dir: Path, sha: str) -> bool:
    from ds4tui.cache.entry import inspect_file
    from ds4tui.format.kvc import kv_name

    path = cache_dir / kv_name(sha)
    return path.is_file() and inspect_file(path, deep=False).pinned


def _confirm(question: str) -> bool:
    print(question, end="", flush=True)
    try:
        answer = sys.stdin.readline()
    except (OSError, ValueError):
        answer = ""
    if not answer.endswith("\n"):
        print()  # end of input: the question's line ends here
    return answer.strip().lower() in ("y", "yes")


# -- grep --------------------------------------------------------------------------------------------


@_one_line_store_errors
def cmd_grep(args) -> int:
    with _opened(args, create=False) as store:
        try:
            hits = store.grep(args.pattern, regex=args.regex) if store is not None else []
        except (re.error, ValueError) as exc:
            raise CliError(f"bad regular expression {args.pattern!r}: {exc}") from None
    if args.json:
        _print_json([{"id": h.chat.id, "title": h.chat.title, "where": h.where, "snippet": h.snippet} for h in hits])
    else:
        for h in hits:
            print(f"{h.chat.id[:ID_CHARS]}  {safe_text(h.chat.display_title, 40)}  {h.where}: {safe_text(h.snippet)}")
    return 0 if hits else 1
