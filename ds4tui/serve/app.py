"""The HTTP side of `ds4tui serve`: a Starlette app speaking OpenAI's chat-completions API.

Owns: routes (/health, /v1/models, /v1/chat/completions, /v1/completions), the Bearer check
(constant-time), the body cap and JSON depth limit, OpenAI-shaped error bodies
for every 4xx/5xx, the checks a streamed request gets before its stream opens
(so they are HTTP errors, not events), CORS for the origins the operator
names, server-sent events through sse-starlette (progress chunks while
prefilling when asked, text deltas, the usage chunk, `[DONE]`, comment pings),
and cancelling a request whose client went away. The engine work itself runs
in serve/worker.py; the wire format is serve/protocol.py.

Nothing a client sends becomes a path or a file name: requests carry text,
the cache directory is the operator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import time
from typing import AsyncIterator, Sequence

from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ds4tui.chat.events import PrefillProgress, PrefillStarted, TokenText
from ds4tui.chat.stateless import Completion
from ds4tui.engine.errors import ContextFullError, EngineError
from ds4tui.errors import Ds4tuiError
from ds4tui.serve import protocol as p
from ds4tui.serve.model_names import ServedNames
from ds4tui.engine.text.reply_parts import ReplyParser
from ds4tui.serve.worker import End, EngineQueue, Job

PING_S = 10.0  # SSE comment pings: keep proxies from closing a stream that waits in line
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there
# The `localhost` CORS origin: a page served from this machine, any port (llama-server's
# `--cors-origins localhost` means the same).
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]+)?"
log = logging.getLogger("uvicorn.error")  # uvicorn's own lines, at its --log-level


def error(status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
          param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(p.error_body(message, kind=kind, code=code, param=param), status_code=status,
                        headers=headers)


def create_app(engine: EngineQueue, *, model_name: str | ServedNames, api_key: str | None, max_body_bytes: int,
               on_shutdown=None, cors_origins: Sequence[str] = ()) -> Starlette:
    """Long because the routes are closures over the one app's state (the engine queue, the key, the model
    name); each is a few lines. `model_name`: the names requests may give (a str: that one only)."""
    created = int(time.time())
    names = model_name if isinstance(model_name, ServedNames) else ServedNames(model_name)
    model_name = names.id

    def authorized(request: Request) -> JSONResponse | None:
        """None when the request may go on, else the 401 to send."""
        if not api_key:
            return None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode()):
            return None
        return error(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                     kind="authentication_error", code="invalid_api_key",
                     headers={"WWW-Authenticate": "Bearer"})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model_name, **engine.state()})

    async def models(request: Request) -> Response:
        refused = authorized(request)
        if refused is not None:
            return refused
        # Off the event loop: the first ask may probe the engine with a session.
        context = await asyncio.to_thread(lambda: engine.context)
        return JSONResponse(p.models_body(names.listed, created, context))

    async def chat_completions(request: Request) -> Response:
        return await run(request, p.parse_chat_request, text=False)

    async def completions(request: Request) -> Response:
        return await run(request, p.parse_completion_request, text=True)

    async def run(request: Request, parse, text: bool) -> Response:
        refused = authorized(request)
        if refused is not None:
            return refused
        try:
            body = await _read_json(request, max_body_bytes)
            names.check(body)  # 404 model_not_found for a model not served here
            req = parse(body, context=engine.context)
            engine.check_tools(req)
            if req.stream:
                # A stream's status line goes out before the engine runs: what can be known
                # now (the prompt's length, a template that refuses the messages) is checked
                # now, off the event loop, so it is a 400 and not an error event.
                await asyncio.to_thread(engine.check_prompt, req)
        except ClientGone as gone:
            log.info("client %s went away in the middle of its request body (%s)", _peer(request), gone)
            return Response(status_code=400)  # nobody reads it
        except p.RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        job = engine.submit(req)
        if job is None:
            wait = engine.retry_after()
            return error(429, f"the server is busy ({engine.max_waiting} requests already wait);"
                              f" retry in {wait:.1f} s", kind="rate_limit_error", code="server_busy",
                         headers={"Retry-After": str(max(1, math.ceil(wait))),
                                  "retry-after-ms": str(max(1, round(wait * 1000)))})
        if text:
            rid = "cmpl-" + p.new_id().removeprefix("chatcmpl-")
            if req.stream:
                return EventSourceResponse(_stream_text(job, rid, model_name), ping=PING_S,
                                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return await _complete_text(request, job, rid, model_name)
        rid = p.new_id()
        parser = engine.reply_parser(req)
        if req.stream:
            return EventSourceResponse(_stream(job, rid, model_name, parser), ping=PING_S,
                                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _complete(request, job, rid, model_name, parser)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error(exc.status_code, exc.detail or "error", kind="invalid_request_error",
                     headers=getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception) -> Response:
        return error(500, f"internal error: {type(exc).__name__}", kind="server_error")

    middleware = []
    if cors_origins:
        named = [o for o in cors_origins if o != "localhost"]
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=named,
            allow_origin_regex=LOCAL_ORIGINS if "localhost" in cors_origins else None,
            allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["Authorization", "Content-Type"],
            max_age=600))
    return Starlette(
        middleware=middleware,
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=_lifespan(on_shutdown),
    )


def _lifespan(on_shutdown):
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)  # blocking saves: off the event loop

    return lifespan


class ClientGone(Ds4tuiError):
    """The client hung up before its request body was whole."""


def _peer(request: Request) -> str:
    c = request.client
    return f"{c.host}:{c.port}" if c else "?"


async def _read_json(request: Request, cap: int) -> object:
    """The body as JSON; RequestError (413) past `cap` bytes, (400) when it is not JSON or is
    nested deeper than the parser goes; ClientGone when the client hangs up meanwhile."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > cap):
        raise p.RequestError(f"the request body exceeds {cap} bytes", status=413, code="body_too_large")
    body = bytearray()
    try:
        async for piece in request.stream():
            body += piece
            if len(body) > cap:
                raise p.RequestError(f"the request body exceeds {cap} bytes", status=413, code="body_too_large")
    except ClientDisconnect:
        raise ClientGone(f"{len(body)} bytes of {length or 'a chunked body'} read") from None
    try:
        return json.loads(body)
    except RecursionError:
        raise p.RequestError("the body is nested too deeply to parse") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise p.RequestError(f"the body is not valid JSON ({exc})") from None


def _failure(exc: BaseException) -> tuple[int, dict]:
    if isinstance(exc, ContextFullError):
        return 400, p.error_body(str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, EngineError):
        return 500, p.error_body(str(exc), kind="server_error")
    if isinstance(exc, ValueError):  # the chat template refused the messages (order, roles)
        return 400, p.error_body(f"cannot render these messages: {exc}", param="messages")
    return 500, p.error_body(f"internal error: {type(exc).__name__}", kind="server_error")


async def _whole(request: Request, job: Job) -> tuple[Completion, None] | tuple[None, Response]:
    """(the job's result, None), or (None, the response its failure or cancel makes); a client
    that disconnects meanwhile cancels it."""
    item = await _end(request, job)
    if item.error is not None:
        status, body = _failure(item.error)
        return None, JSONResponse(body, status_code=status)
    if item.result is None:
        return None, error(499, "the request was cancelled", code="cancelled")
    return item.result, None


async def _complete(request: Request, job: Job, rid: str, model: str, parser: ReplyParser) -> Response:
    """Wait for the whole reply."""
    created = int(time.time())
    result, failed = await _whole(request, job)
    if failed is not None:
        return failed
    pieces = parser.feed(result.text) + parser.finish()
    content = "".join(t for kind, t in pieces if kind == "content")
    reasoning = "".join(t for kind, t in pieces if kind == "reasoning")
    return JSONResponse(p.completion_body(rid, model, created, result, content=content, reasoning=reasoning,
                                          tool_calls=[c.body() for c in parser.calls]))


async def _complete_text(request: Request, job: Job, rid: str, model: str) -> Response:
    created = int(time.time())
    result, failed = await _whole(request, job)
    if failed is not None:
        return failed
    return JSONResponse(p.text_completion_body(rid, model, created, result))


async def _stream_text(job: Job, rid: str, model: str) -> AsyncIterator[str]:
    """/v1/completions' SSE lines: text chunks, the finish chunk, usage when asked, [DONE]."""
    created = int(time.time())
    events = _Events(job)
    try:
        async for item in events:
            if isinstance(item, TokenText) and item.text and job.dropped is None:
                yield _json(p.text_chunk(rid, model, created, text=item.text))
        failed = events.failure_line()
        if failed is not None:
            yield failed
        elif events.end is not None and events.end.result is not None:
            result = events.end.result
            yield _json(p.text_chunk(rid, model, created, finish=p.FINISH.get(result.done.stop, "stop")))
            if job.request.include_usage:
                yield _json(p.text_chunk(rid, model, created, choices=False, usage=p.usage(result)))
        yield "[DONE]"
    finally:
        events.close()


class _Events:
    """`async for` over a job's events up to its End, which is kept in `end` once it came;
    `close()` cancels the job when the stream stopped before that (the client went away)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.end: End | None = None

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> object:
        item = await self.job.get()
        if isinstance(item, End):
            self.end = item
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        if self.end is None:
            self.job.cancel.set()

    def failure_line(self) -> str | None:
        """The SSE line that ends a stream the server dropped (a client too slow to read) or
        whose turn failed; None when it has its result."""
        if self.job.dropped is not None:
            return _json(p.error_body(f"the server cancelled this request: {self.job.dropped}", kind="server_error",
                                      code="client_too_slow"))
        if self.end is not None and self.end.error is not None:
            return _json(_failure(self.end.error)[1])
        return None


async def _end(request: Request, job: Job) -> End:
    """The job's End, skipping its other events; a client that disconnects meanwhile cancels it."""
    item: object = None
    getter = asyncio.ensure_future(job.get())
    try:
        while not isinstance(item, End):
            done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
            if done:
                item = getter.result()
                if not isinstance(item, End):
                    getter = asyncio.ensure_future(job.get())
            elif await request.is_disconnected():
                job.cancel.set()  # the engine stops at its next chunk and hands back End
    finally:
        if not isinstance(item, End):  # this coroutine itself was cancelled
            getter.cancel()
            job.cancel.set()
    assert isinstance(item, End)
    return item


def _deltas(rid: str, model: str, created: int, pieces: list[tuple[str, str]]) -> list[str]:
    """Chunks for the parser's pieces: content as `content`, reasoning as `reasoning_content`."""
    field = {"content": "content", "reasoning": "reasoning_content"}
    return [_json(p.chunk(rid, model, created, delta={field[kind]: text})) for kind, text in pieces if text]


async def _stream(job: Job, rid: str, model: str, parser: ReplyParser) -> AsyncIterator[str]:
    """SSE data lines for one request; closing the generator (client gone) cancels the turn."""
    created = int(time.time())
    started = time.perf_counter()
    first = True
    cached = total_new = 0
    events = _Events(job)
    try:
        async for item in events:
            if job.dropped is not None:
                continue  # cancelled for not reading: what is still queued is skipped
            if first:  # OpenAI's first chunk names the role
                first = False
                yield _json(p.chunk(rid, model, created, delta={"role": "assistant", "content": ""}))
            if isinstance(item, PrefillStarted):
                cached, total_new = item.cached, item.total
                if total_new and job.request.return_progress:
                    yield _json(p.chunk(rid, model, created, delta={"content": ""},
                                             prompt_progress=p.progress(cached, total_new, 0, started)))
            elif isinstance(item, PrefillProgress) and job.request.return_progress:
                yield _json(p.chunk(rid, model, created, delta={"content": ""},
                                         prompt_progress=p.progress(cached, total_new, item.done, started)))
            elif isinstance(item, TokenText) and item.text:
                for line in _deltas(rid, model, created, parser.feed(item.text)):
                    yield line
        failed = events.failure_line()
        if failed is not None:
            yield failed
        elif events.end is not None and events.end.result is not None:
            c = events.end.result
            if first:
                yield _json(p.chunk(rid, model, created, delta={"role": "assistant", "content": ""}))
            for line in _deltas(rid, model, created, parser.finish()):
                yield line
            for i, call in enumerate(parser.calls):  # each call whole, once it parsed
                yield _json(p.chunk(rid, model, created, delta={"tool_calls": [{"index": i, **call.body()}]}))
            finish = "tool_calls" if parser.calls else p.FINISH.get(c.done.stop, "stop")
            yield _json(p.chunk(rid, model, created, finish=finish))
            if job.request.include_usage:
                yield _json(p.chunk(rid, model, created, choices=False, usage=p.usage(c)))
        yield "[DONE]"
    finally:
        events.close()


def _json(body: object) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
