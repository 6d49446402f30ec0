"""`ds4tui serve`: the engine and its disk cache as an OpenAI-compatible HTTP server.

Owns the command line: the chat's model/cache flags (same config file
underneath), the network and safety flags, and the API key, which is read from
an environment variable (never a flag: command lines show up in `ps`).
The server itself is ds4tui/serve/.
"""

from __future__ import annotations

import argparse
import os

from ds4tui.cli.errors import CliError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API",
        description="An OpenAI-compatible server (/v1/chat/completions, /v1/models, /health) on the embedded "
                    "engine, sharing the chat's disk KV cache: a request that extends an earlier one "
                    "prefills only the new part. Binds to loopback unless an API key is set.",
    )
    p.add_argument("--model", help="model spec (as for the chat)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other needs --api-key-env)")
    p.add_argument("--port", type=int, default=8008, help="port (default 8008)")
    p.add_argument("--cache-dir", help="KV cache directory (default: the chat's)")
    p.add_argument("--budget-mb", type=int, help="disk budget of the KV cache in MiB")
    p.add_argument("--no-disk-cache", action="store_true", help="do not read or write .kv files")
    p.add_argument("--ctx", type=int, help="context size of each session in tokens")
    p.add_argument("--api-key-env", metavar="VAR", help="require `Authorization: Bearer $VAR` on /v1 routes")
    p.add_argument("--live-sessions", type=int, metavar="N", help="sessions kept in memory (LRU; the rest park on disk)")
    p.add_argument("--parallel", type=int, default=4, metavar="N",
                   help="requests run and decoded together (default 4; each holds a live session)")
    p.add_argument("--queue-size", type=int, default=16, metavar="N",
                   help="requests that may wait behind the running ones; more get 429 (default 16)")
    p.add_argument("--max-body-mb", type=int, default=8, metavar="N", help="largest request body (default 8)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN call the API (repeatable; `localhost`: any port on this "
                        "machine; `*`: any page). Off by default")
    p.add_argument("--alias", action="append", default=[], metavar="NAME",
                   help="another `model` name requests may give (repeatable; `*`: any name). Other names get "
                        "a 404 model_not_found naming the model served")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ds4tui.cli.chat import chat_config, check_model
    from ds4tui.config import ConfigError, with_overrides
    from ds4tui.engine.errors import EngineError
    from ds4tui.serve.main import ServeError, ServeOptions, run

    config = chat_config(args)
    try:
        config = with_overrides(config, live_sessions=args.live_sessions)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env, "")
        if not key.strip():
            raise CliError(f"--api-key-env {args.api_key_env}: that variable is not set or empty")
        key = key.strip()
    if args.max_body_mb <= 0:
        raise CliError("--max-body-mb must be positive")
    options = ServeOptions(host=args.host, port=args.port, api_key=key, queue_size=args.queue_size,
                           max_body_bytes=args.max_body_mb << 20, log_level=args.log_level,
                           cors_origins=tuple(args.cors_origin), parallel=args.parallel,
                           aliases=tuple(a.strip() for a in args.alias if a.strip()))
    try:
        check_model(config.model)
        return run(config, options)
    except (ServeError, EngineError) as exc:
        raise CliError(str(exc)) from None
