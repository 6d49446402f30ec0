"""One OpenAI-compatible server as the remote chat sees it: its model, its context, one streamed reply.

Owns `RemoteServer`: the HTTP client, `/models` (the model to use, --remote-model or the
first listed, and its context where the server says it), streaming one
`/chat/completions` reply into a `ReplyReader` with the "waiting for the server" clock,
and cancel (closing the stream, which every server takes as "stop generating"); and the
one-line descriptions of what went wrong (`describe_status`, `describe_transport`), also
used by the probe before the UI opens (remote_probe.py). Knows nothing of conversations,
their history or the store: chat/remote.py builds the request and keeps the books.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import httpx

from ds4tui.chat.events import ChatEvent, Waiting
from ds4tui.chat.remote_stream import RemoteError, ReplyReader, sse_data

EventFn = Callable[[ChatEvent], None]
CONNECT_S = 10.0
READ_S = 600.0  # a long prompt on a slow server may take minutes before its first byte
WAITING_TICK_S = 0.5  # how often the "waiting for the server" line updates
# What /v1/models may say a model's context is: vLLM and ds4tui serve, LM Studio, OpenRouter.
CONTEXT_FIELDS = ("max_model_len", "context_length", "max_context_length")


class RemoteServer:
    """The server at `endpoint` (its /v1 base URL). Threading: `stream` runs in the chat's
    worker thread, one at a time; `cancel` may come from any thread."""

    def __init__(self, endpoint: str, *, api_key: str | None = None, model: str | None = None,
                 transport: httpx.BaseTransport | None = None, models: list[dict] | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.model_id = model
        self.context: int | None = None  # the server's context, when /models says it
        self.models_asked = False
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(headers=headers, transport=transport,
                                  timeout=httpx.Timeout(READ_S, connect=CONNECT_S))
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._response: httpx.Response | None = None
        if models:
            self.take_models(models)

    # -- cancelling ----------------------------------------------------------------------------

    def cancel(self) -> None:
        """Close the running stream (any thread); the server stops generating."""
        self._cancel.set()
        with self._lock:
            response = self._response
        if response is not None:
            response.close()

    def clear_cancel(self) -> None:
        """Before a new request: an old cancel must not stop it."""
        self._cancel.clear()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # -- the model -----------------------------------------------------------------------------

    def model(self) -> str:
        """--remote-model, else the first model the server lists. /models is asked until it
        answers once, also for the model's context where the server says it."""
        if self.models_asked:
            assert self.model_id is not None
            return self.model_id
        try:
            r = self._http.get(f"{self.endpoint}/models", timeout=CONNECT_S)
        except httpx.HTTPError as exc:
            if self.model_id is None:
                raise RemoteError(describe_transport(exc, self.endpoint, 0)) from None
            return self.model_id  # named: the context is asked for again next turn
        if r.status_code != 200 and self.model_id is None:
            raise RemoteError(describe_status(r, self.endpoint))
        try:
            entries = [m for m in r.json()["data"] if isinstance(m, dict)] if r.status_code == 200 else []
        except (ValueError, KeyError, TypeError):
            entries = []
        if self.model_id is None and (not entries or "id" not in entries[0]):
            raise RemoteError(f"{self.endpoint}/models lists no model: pass --remote-model NAME")
        return self.take_models(entries)

    def take_models(self, entries: list[dict]) -> str:
        """/models' entries: the model (--remote-model, else the first listed) and its context."""
        if self.model_id is None:
            self.model_id = str(entries[0]["id"])
        self.models_asked = True
        mine = next((m for m in entries if str(m.get("id")) == self.model_id), None)
        self.context = context_of(mine) if mine is not None else None
        return self.model_id

    # -- a reply -------------------------------------------------------------------------------

    def stream(self, body: dict, reader: ReplyReader, on_event: EventFn, started: float) -> bool:
        """POST `body` and feed the reply's events to `reader`; whether the stream ended
        ([DONE] or a finish reason). RemoteError for a refusal or a drop, unless cancelled
        (closing a stream mid-read may surface as anything)."""
        ticker = _WaitingTicker(on_event, started)
        finished = False
        try:
            with self._http.stream("POST", f"{self.endpoint}/chat/completions", json=body) as response:
                with self._lock:
                    self._response = response
                if self._cancel.is_set():
                    response.close()
                if response.status_code != 200:
                    response.read()
                    raise RemoteError(describe_status(response, self.endpoint))
                for data in sse_data(response.iter_lines()):
                    if data.strip() == "[DONE]":
                        finished = True
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise RemoteError("the server sent an event that is not JSON") from None
                    if ticker.running and _has_signal(chunk):
                        ticker.stop()  # joined before the reader emits: one thread sends events
                    reader.feed(chunk)
                finished = finished or reader.finish is not None
        except (httpx.HTTPError, httpx.StreamError) as exc:
            if not self._cancel.is_set():
                raise RemoteError(describe_transport(exc, self.endpoint, reader.tokens)) from None
        except Exception:
            if not self._cancel.is_set():
                raise
        finally:
            ticker.stop()
            with self._lock:
                self._response = None
        return finished


def context_of(entry: dict) -> int | None:
    """What a /models entry says the model's context is (CONTEXT_FIELDS), or None."""
    for key in CONTEXT_FIELDS:
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _has_signal(chunk: object) -> bool:
    """Progress, text, an end or an error: anything after which elapsed time is not the news."""
    if not isinstance(chunk, dict):
        return True
    if "prompt_progress" in chunk or "error" in chunk:
        return True
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and (choice.get("finish_reason")
                                         or (isinstance(choice.get("delta"), dict) and choice["delta"].get("content"))):
            return True
    return False


class _WaitingTicker:
    """Emits Waiting(elapsed) every tick until stopped: the screen's clock while a server that
    sends no progress reads the prompt. Stopped (and joined) before the first real event."""

    def __init__(self, emit: EventFn, started: float) -> None:
        self._emit = emit
        self._started = started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ds4tui-waiting", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.wait(WAITING_TICK_S):
            self._emit(Waiting(elapsed_s=time.perf_counter() - self._started))

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()


def describe_status(response: httpx.Response, endpoint: str) -> str:
    """One line for a non-200 answer, with the server's own message when it sent one."""
    code = response.status_code
    try:
        err = response.json().get("error")
        detail = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        detail = None
    detail = f": {str(detail)[:200]}" if detail else ""
    if code in (401, 403):
        return f"the server refused the API key (HTTP {code}){detail}. Set it with --api-key-env VAR"
    if code == 429:
        wait = response.headers.get("retry-after")
        return f"the server is busy (HTTP 429){detail}" + (f"; retry in {wait} s" if wait else "; retry later")
    if code == 404:
        return f"{endpoint} has no such route (HTTP 404){detail}. --engine should end in /v1"
    return f"the server answered HTTP {code}{detail}"


def describe_transport(exc: Exception, endpoint: str, tokens: int) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {endpoint}: connection refused or no route (is the server running?)"
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot connect to {endpoint}: timed out"
    if isinstance(exc, httpx.ReadTimeout):
        return f"the server sent nothing for {READ_S:.0f} s"
    return f"the stream dropped after {tokens} token(s) ({type(exc).__name__})"
