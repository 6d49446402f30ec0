"""`ds4tui` with no command: the chat. Flags mirror the config file's keys.

Everything that can fail with a one-line message is checked here, before the
full-screen UI takes the terminal: a bad config file, a model that is not on
disk (the engine's ModelNotFoundError names `ds4tui models pull ...`) or whose
file cannot be a model (engine/model_check.py: not a GGUF, cut short), a
`--resume` that matches nothing or several sessions. The model itself is
loaded by the UI, in a worker, behind a loading indicator.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ds4tui.command import command


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    from ds4tui import paths
    from ds4tui.config import Config
    from ds4tui.engine.defaults import DEFAULT_CTX, DEFAULT_MODEL

    # The defaults printed are the real ones (the cache directory as resolved on this
    # machine now); the config file, when it sets a key, overrides them.
    defaults = Config()
    parser.add_argument("--model", help="model spec: a name from `ds4tui models list`, a GGUF file or a"
                                         f" checkpoint directory (default: {DEFAULT_MODEL})")
    parser.add_argument("--cache-dir", help=f"KV cache directory (default: {paths.cache_dir()})")
    parser.add_argument("--data-dir", metavar="DIR",
                        help=f"where the chat history lives, DIR/{paths.STORE_FILE} (default: {paths.store_path()})")
    parser.add_argument("--budget-mb", type=int,
                        help=f"disk budget of the KV cache in MiB (default: {defaults.budget_mb})")
    parser.add_argument("--ctx", type=int,
                        help=f"context size in tokens (default: {DEFAULT_CTX}, or the model's own context if smaller)")
    parser.add_argument("--resume", metavar="ID_OR_TITLE",
                        help="open a saved chat: its id prefix (`ds4tui chats ls`), its title or the start of"
                             " its title (or a titled .kv file's name prefix)")
    parser.add_argument("--no-disk-cache", action="store_true", help="do not read or write .kv files")
    remote = parser.add_argument_group("remote engine", "chat with an OpenAI-compatible server instead of the "
                                       "embedded engine (ds4-server, llama-server, vLLM, SGLang, ds4tui serve)")
    remote.add_argument("--engine", metavar="URL", help="the server's /v1 base URL, e.g. http://127.0.0.1:8008/v1")
    remote.add_argument("--api-key-env", metavar="VAR", help="send `Authorization: Bearer $VAR`")
    remote.add_argument("--remote-model", metavar="NAME", help="model name to request (default: the first the server lists)")


def chat_config(args: argparse.Namespace):
    """The config file with the flags on top; CliError for a bad file or flag."""
    from ds4tui.cli.errors import CliError
    from ds4tui.config import ConfigError, load_config, with_overrides

    try:
        return with_overrides(
            load_config(),
            model=getattr(args, "model", None),
            cache_dir=getattr(args, "cache_dir", None),
            data_dir=getattr(args, "data_dir", None),
            budget_mb=getattr(args, "budget_mb", None),
            ctx=getattr(args, "ctx", None),
            no_disk_cache=True if getattr(args, "no_disk_cache", False) else None,
        )
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def check_model(spec: str) -> None:
    """Raise ModelNotFoundError or WeightsError when `spec` names nothing loadable (a missing
    path, an unknown name, /etc/passwd, a text file named .gguf, a truncated GGUF), without
    loading weights: engine/model_check.py. A registered model that is not downloaded yet
    passes: the chat's start screen pulls it, with its progress (chat/startup.py)."""
    from ds4tui.chat.startup import download_needed
    from ds4tui.engine.model_check import check_model as check

    if download_needed(spec) is None:
        check(spec)


def context_limit(spec: str) -> int | None:
    """The model's trained context length, read from its metadata without loading weights;
    None when it cannot be told cheaply (the engine then checks)."""
    import json

    try:
        path = Path(spec).expanduser()
        if not path.exists():
            from ds4tui.engine.registry import resolve_registered

            path = resolve_registered(spec)
        if path is None:
            return None
        if path.is_dir():
            cfg = json.loads((path / "config.json").read_text())
            return int(cfg["max_position_embeddings"])
        return _gguf_context_length(path)
    except Exception:  # noqa: BLE001 - a best-effort early check; the engine has the last word
        return None


# GGUF metadata value types -> struct format of a scalar (8 string, 9 array are handled apart).
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _gguf_context_length(path: Path) -> int | None:
    """`llama.context_length` from a GGUF's key/value header, read in order until found (the
    gguf package's reader maps every tensor first: seconds, before the UI has started)."""
    import struct

    with open(path, "rb") as fp:
        def take(fmt: str):
            size = struct.calcsize(fmt)
            data = fp.read(size)
            if len(data) != size:
                raise ValueError("truncated GGUF header")
            return struct.unpack(fmt, data)[0]

        def skip(vtype: int) -> None:
            if vtype == 8:
                fp.seek(take("<Q"), 1)
            elif vtype == 9:
                inner, count = take("<I"), take("<Q")
                if inner in _GGUF_SCALARS:
                    fp.seek(struct.calcsize(_GGUF_SCALARS[inner]) * count, 1)
                else:
                    for _ in range(count):
                        skip(inner)
            else:
                fp.seek(struct.calcsize(_GGUF_SCALARS[vtype]), 1)

        if fp.read(4) != b"GGUF":
            return None
        take("<I"), take("<Q")  # version, tensor count
        for _ in range(take("<Q")):
            key = fp.read(take("<Q"))
            vtype = take("<I")
            if key == b"llama.context_length" and vtype in _GGUF_SCALARS:
                return int(take(_GGUF_SCALARS[vtype]))
            skip(vtype)
    return None


def check_resume(query: str, cache_dir: Path) -> str:
    """The sha of the one titled session in `cache_dir` that `query` names; CliError unless
    exactly one matches."""
    from ds4tui.cache.entry import inspect_file
    from ds4tui.cache.store import KvStore
    from ds4tui.cli.errors import CliError

    store = KvStore(cache_dir)
    problem = store.problem(write=False)
    if problem:
        raise CliError(f"--resume {query!r}: {problem}")
    titled = []
    for sha in store.shas():
        e = inspect_file(store.path_for(sha), deep=True, preview_bytes=0)
        if e.valid and e.header is not None and e.header.titled and e.title is not None:
            titled.append((sha, e.title))
    from ds4tui.chat.matching import match_sessions

    matches = match_sessions(query, titled, lambda t: t[0], lambda t: t[1])
    if not matches:
        raise CliError(f"--resume {query!r}: no saved session matches in {cache_dir} (see `{command('kv ls')}`)")
    if len(matches) > 1:
        from ds4tui.format.display import safe_text

        names = "; ".join(f"{sha[:12]} {safe_text(title, 40)}" for sha, title in matches[:5])
        raise CliError(f"--resume {query!r} matches {len(matches)} sessions: {names}")
    return matches[0][0]


def resume_model(config, sha: str, *, explicit: bool):
    """The config to resume `sha` with: the model that wrote it (chat/model_memo.py) unless
    --model chose one, so a Gemma 3 chat opens on Gemma 3 whatever the default is."""
    from dataclasses import replace

    from ds4tui.chat.model_memo import writer_of

    writer = None if explicit else writer_of(config.cache_path(), sha)
    return replace(config, model=writer) if writer and writer != config.model else config


def run_chat(args: argparse.Namespace) -> int:
    from ds4tui.cli.errors import CliError
    from ds4tui.engine.errors import EngineError

    config = chat_config(args)
    if getattr(args, "engine", None):
        return run_remote_chat(args, config)
    resume = getattr(args, "resume", None)
    if resume:
        if config.no_disk_cache:
            raise CliError("--resume needs the disk cache (drop --no-disk-cache)")
        config = resume_model(config, check_resume(resume, config.cache_path()), explicit=bool(args.model))
    try:
        check_model(config.model)
    except EngineError as exc:
        raise CliError(str(exc)) from None
    if config.ctx is not None:
        limit = context_limit(config.model)
        if limit is not None and config.ctx > limit:
            raise CliError(f"--ctx {config.ctx}: {config.model} has a context of {limit} tokens at most")

    require_terminal()

    from ds4tui.screens.app import Ds4TuiApp

    Ds4TuiApp(config, resume=resume, imported=getattr(args, "imported", None)).run()
    return 0


def require_terminal() -> None:
    """CliError when stdout is no terminal: the full-screen UI would have nowhere to draw and spin."""
    from ds4tui.cli.errors import CliError

    if not sys.stdout.isatty():
        raise CliError(f"the chat needs a terminal: stdout is not one (for scripts: `{command('kv ...')}`,"
                       f" `{command('bench ...')}`)")


def remote_target(args: argparse.Namespace) -> tuple[str, str | None]:
    """The --engine URL and the API key from the flags (no connection yet); CliError for a bad
    URL or a missing key."""
    import os

    import httpx

    from ds4tui.cli.errors import CliError

    try:
        url = httpx.URL(args.engine)
    except (httpx.InvalidURL, TypeError) as exc:
        raise CliError(f"--engine {args.engine!r}: not a URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise CliError(f"--engine {args.engine!r}: give an http(s) URL such as http://127.0.0.1:8008/v1")
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env, "").strip()
        if not key:
            raise CliError(f"--api-key-env {args.api_key_env}: that variable is not set or empty")
    return str(url), key


def remote_controller(args: argparse.Namespace, config, url: str, key: str | None):
    """The remote chat's controller, once the server at `url` answered (chat/remote_probe.py:
    GET /models, with /v1 added when the URL lacks it); what it found is printed as one line.
    CliError when nothing answers, instead of a chat that fails at its first message."""
    from ds4tui.chat.remote import RemoteChatController
    from ds4tui.chat.remote_probe import found, probe_endpoint
    from ds4tui.chat.remote_stream import RemoteError
    from ds4tui.cli.errors import CliError

    try:
        probe = probe_endpoint(url, api_key=key, model=args.remote_model)
    except RemoteError as exc:
        raise CliError(str(exc)) from None
    print(f"ds4tui: {found(probe, args.remote_model)}", flush=True)
    return RemoteChatController(probe.endpoint, config, api_key=key, model=args.remote_model, models=probe.models)


def run_remote_chat(args: argparse.Namespace, config) -> int:
    from ds4tui import paths
    from ds4tui.cli.errors import CliError
    from ds4tui.store import open_store

    url, key = remote_target(args)
    resume = getattr(args, "resume", None)
    if resume:  # looked up before any connection: a name that matches nothing needs no server
        store = open_store(paths.store_path(config.data_dir))
        try:
            matches = store.find(resume)
            where = store.path or "the store (in memory)"
        finally:
            store.close()
        if len(matches) != 1:
            what = "nothing" if not matches else f"{len(matches)} chats"
            raise CliError(f"--resume {resume!r} matches {what} in {where} (see `ds4tui chats ls`)")
    require_terminal()  # the remote chat too (it used to start its UI into a pipe)
    controller = remote_controller(args, config, url, key)
    from ds4tui.screens.app import Ds4TuiApp

    Ds4TuiApp(config, controller=controller, resume=resume).run()
    return 0
