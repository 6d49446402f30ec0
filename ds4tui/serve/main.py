"""Starting `ds4tui serve`: the safety checks, the model and its controller, uvicorn.

Owns: refusing a non-loopback address without an API key, loading the model and
warming it up before the port opens (so /health only answers once requests
can run), building the app, and the shutdown that saves every live session
(reason `shutdown`) like the chat's quit does.
"""

from __future__ import annotations

import gc
import ipaddress
import sys
from dataclasses import dataclass

from ds4tui.config import Config
from ds4tui.errors import Ds4tuiError

DEFAULT_PORT = 8008
DEFAULT_QUEUE = 16  # requests that may wait behind the running one before 429s start
DEFAULT_MAX_BODY_MB = 8  # ~2M tokens of text: far past any context this engine holds


class ServeError(Ds4tuiError):
    """A setting that makes the server refuse to start; the message says what to change."""


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    queue_size: int = DEFAULT_QUEUE
    max_body_bytes: int = DEFAULT_MAX_BODY_MB << 20
    log_level: str = "info"
    parallel: int = 4  # requests decoded together (serve/worker.py DEFAULT_PARALLEL)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed (CORS); none: no CORS headers
    aliases: tuple[str, ...] = ()  # other `model` names requests may give (serve/model_names.py)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_options(options: ServeOptions) -> None:
    if not is_loopback(options.host) and not options.api_key:
        raise ServeError(f"--host {options.host} is reachable from other machines: set an API key first "
                         "(export KEY=...; ds4tui serve --api-key-env KEY ...)")
    if not 0 < options.port < 65536:
        raise ServeError(f"--port must be within 1..65535, got {options.port}")
    if options.queue_size < 0:
        raise ServeError("--queue-size must be >= 0")
    if not 1 <= options.parallel <= 64:
        raise ServeError(f"--parallel must be within 1..64, got {options.parallel}")
    for origin in options.cors_origins:
        if origin not in ("*", "localhost") and not origin.startswith(("http://", "https://")):
            raise ServeError(f"--cors-origin {origin!r}: expected *, localhost or an origin such as "
                             "http://example.com:3000")


def run(config: Config, options: ServeOptions) -> int:
    """Load the model, serve until interrupted, save the live sessions; the exit status."""
    check_options(options)
    import uvicorn

    from ds4tui.chat.controller import ChatController
    from ds4tui.chat.stateless import StatelessChats
    from ds4tui.engine.loader import load_model
    from ds4tui.serve.app import create_app
    from ds4tui.serve.model_names import ServedNames
    from ds4tui.serve.worker import EngineQueue

    model = load_model(config.model)
    controller = ChatController(model, config)
    engine = EngineQueue(StatelessChats(controller), options.queue_size, parallel=options.parallel)
    engine.run_sync(controller.warm_up)
    # Out of the collector's reach: a full collection over the model's and the server's startup
    # objects held the GIL for ~100 ms in the middle of a request (screens/app.py, _freeze_heap).
    gc.freeze()

    def shutdown() -> None:
        engine.cancel_all()
        engine.run_sync(controller.shutdown)
        engine.close()

    names = ServedNames(model.info.name, aliases=options.aliases, spec=config.model)
    app = create_app(engine, model_name=names, api_key=options.api_key,
                     max_body_bytes=options.max_body_bytes, on_shutdown=shutdown,
                     cors_origins=options.cors_origins)
    where = "no disk cache" if config.no_disk_cache else f"cache {config.cache_path()}"
    print(f"ds4tui serve: {model.info.name} at http://{options.host}:{options.port}/v1 ({where},"
          f" {config.live_sessions} live sessions, {options.parallel} decoded together, {options.queue_size} may wait"
          f"{', API key required' if options.api_key else ''})", file=sys.stderr, flush=True)
    print(f"ds4tui serve: requests name the model {names.describe()}", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=options.host, port=options.port, log_level=options.log_level,
                                           timeout_graceful_shutdown=5, lifespan="on"))
    server.run()
    return 0
