"""The server's engine: up to `parallel` requests run together, a bounded line waits.

Owns: admitting a request (or refusing it when `max_waiting` already wait: the
server answers 429), running it with its own cancel flag on a thread of its own
that shares the engine through the scheduler's baton (serve/scheduler.py: one
thread runs at a time, decodes are stepped together), handing the turn's events
to the event loop as they happen, cancelling a request whose client does not
read its stream (its unread text past `max_unread` chunks), the Retry-After
estimate, and the counters /health shows. Leaves the mapping of requests to
sessions to chat/stateless.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ds4tui.chat.events import PrefillProgress, PrefillStarted, TokenText
from ds4tui.chat.stateless import Completion, StatelessChats
from ds4tui.chat.turn import TurnOptions
from ds4tui.engine.sampling import SamplingParams
from ds4tui.serve.protocol import ChatRequest, RequestError
from ds4tui.serve.scheduler import Scheduler
from ds4tui.engine.text.reply_parts import ReplyParser, opens_think, syntax_of

STREAMED = (PrefillStarted, PrefillProgress, TokenText)  # what a streaming client is shown
RECENT_WEIGHT = 0.2  # of the newest request in the running mean Retry-After is based on
FIRST_GUESS_S = 1.0  # that mean before any request has finished
# Retry-After is the expected wait times a random factor in [1, 1 + JITTER): refused clients
# come back spread out instead of all at once (into a line that is full again).
JITTER = 1.0
DEFAULT_PARALLEL = 4  # requests decoded together
# Text chunks a streaming request may have waiting for its client before it is cancelled:
# a client that stops reading then costs a bounded buffer, and its slot goes to others.
DEFAULT_MAX_UNREAD = 2048
log = logging.getLogger("uvicorn.error")


@dataclass
class Counters:
    served: int = 0
    cancelled: int = 0  # the client went away (or was cancelled) before the reply ended
    refused: int = 0  # 429: the line was full
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    busy_s: float = 0.0  # engine time spent on requests
    recent_s: float = FIRST_GUESS_S  # running mean of the latest requests' times

    def as_dict(self) -> dict[str, Any]:
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {"served": self.served, "cancelled": self.cancelled, "refused": self.refused,
                "failed": self.failed, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "cache_hit_rate": round(hit, 4)}


class End:
    """The last item a job's event queue carries: the result or the exception."""

    def __init__(self, result: Completion | None = None, error: BaseException | None = None) -> None:
        self.result = result
        self.error = error


@dataclass(eq=False)
class Job:
    loop: asyncio.AbstractEventLoop
    request: ChatRequest
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    unread: int = 0  # text chunks put and not yet taken by the request's coroutine
    dropped: str | None = None  # why the server cancelled it (a client that does not read)

    def put(self, item: object) -> None:
        """From the engine thread: queue an item for the request's coroutine."""
        if isinstance(item, TokenText):
            self.unread += 1  # an int's += is one bytecode under the GIL: no lost update with get()
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is gone (server shutting down): nobody is listening
            pass

    async def get(self) -> object:
        """On the event loop: the next item for the client."""
        item = await self.events.get()
        if isinstance(item, TokenText):
            self.unread -= 1
        return item


class EngineQueue:
    def __init__(self, chats: StatelessChats, max_waiting: int, rng: random.Random | None = None, *,
                 parallel: int = DEFAULT_PARALLEL, max_unread: int = DEFAULT_MAX_UNREAD) -> None:
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        self.chats = chats
        self.max_waiting = max_waiting
        self.parallel = parallel
        self.max_unread = max_unread
        self.counters = Counters()
        self.scheduler = Scheduler()
        self._rng = rng or random.Random()
        self._opens_think: bool | None = None
        # One thread per running request (the rest wait in the executor's queue, in arrival
        # order) and one for run_sync's work; the scheduler lets one of them run at a time.
        self._executor = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="ds4tui-engine")
        self._sync = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ds4tui-engine-sync")
        self._lock = threading.Lock()
        self._pending = 0  # running + waiting
        self._running = 0
        self._jobs: set[Job] = set()

    def state(self) -> dict[str, Any]:
        with self._lock:
            s = self.scheduler
            return {"running": self._running, "waiting": self._pending - self._running,
                    "max_waiting": self.max_waiting, "parallel": self.parallel,
                    "batch_mean": round(s.stepped / s.steps, 2) if s.steps else 0.0,
                    **self.counters.as_dict()}

    def submit(self, request: ChatRequest) -> Job | None:
        """Queue a request (call on the event loop); None when the line is full."""
        with self._lock:
            if self._pending >= self.parallel + self.max_waiting:
                self.counters.refused += 1
                return None
            self._pending += 1
            job = Job(asyncio.get_running_loop(), request)
            self._jobs.add(job)
        self._executor.submit(self._run, job)
        return job

    @property
    def context(self) -> int:
        """Tokens a session holds: the most a prompt and its reply may take."""
        return self.chats.context_size()

    @property
    def tool_syntax(self) -> str | None:
        """The tool-call syntax of the model's chat template (engine/text/reply_parts.py), None: no tools."""
        return syntax_of(getattr(self.chats.controller.model.chat, "source", None))

    @property
    def prompt_opens_think(self) -> bool:
        """Whether the template's generation prompt opens a think block (DeepSeek R1, some Qwen 3
        modes): the reply then starts as reasoning."""
        if self._opens_think is None:
            self._opens_think = opens_think(self.chats.controller.model.chat)
        return self._opens_think

    def reply_parser(self, request: ChatRequest) -> ReplyParser:
        return ReplyParser(self.tool_syntax if request.tools else None, in_think=self.prompt_opens_think)

    def check_tools(self, request: ChatRequest) -> None:
        """RequestError when the request uses tools and the model's template renders none."""
        uses = bool(request.tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in request.messages)
        if uses and self.tool_syntax is None:
            raise RequestError("this model's chat template does not render tools or tool calls", param="tools")

    def check_prompt(self, request: ChatRequest) -> None:
        """RequestError when the request cannot run: its prompt does not fit the context, or the
        chat template refuses its messages. Any thread (it renders and encodes only)."""
        try:
            n = self.chats.prompt_tokens(request.messages, request.tools, request.prompt)
        except ValueError as exc:
            raise RequestError(f"cannot render these messages: {exc}", param="messages") from None
        if n > self.context:
            raise RequestError(f"the prompt needs {n} tokens, the context holds {self.context}",
                               param="messages", code="context_length_exceeded")

    def retry_after(self) -> float:
        """Seconds until a place is likely free, spread: the running mean of the latest
        requests' times x the requests ahead (running and waiting), x a random factor in
        [1, 1 + JITTER) so that clients refused together do not all retry together."""
        with self._lock:
            # The line moves `parallel` requests per request time; a newcomer waits for the
            # ones ahead of it and then its own slot.
            ahead = max(1, self._pending - self.parallel + 1)
            wait = self.counters.recent_s * ahead / self.parallel
        return wait * (1.0 + JITTER * self._rng.random())

    def _run(self, job: Job) -> None:
        with self._lock:
            self._running += 1
        started = time.perf_counter()
        result: Completion | None = None
        error: BaseException | None = None
        try:
            if not job.cancel.is_set():  # the client left while waiting: nothing to do
                emit = self._emitter(job) if job.request.stream else _ignore
                with self.scheduler.running():
                    result = self.chats.complete(job.request.messages, lambda e: _forward(e, emit),
                                                 self._options(job))
        except Exception as exc:  # reported to the client; the engine goes on
            error = exc
        finally:
            with self._lock:
                self._running -= 1
                self._pending -= 1
                self._jobs.discard(job)
                c = self.counters
                took = time.perf_counter() - started
                c.busy_s += took
                if result is not None and error is None:  # the first one replaces the guess
                    c.recent_s = took if not c.served else c.recent_s + RECENT_WEIGHT * (took - c.recent_s)
                if error is not None:
                    c.failed += 1
                elif result is None or job.cancel.is_set():
                    c.cancelled += 1
                else:
                    c.served += 1
                    c.prompt_tokens += result.prompt_tokens
                    c.cached_tokens += result.cached_tokens
            job.put(End(result, error))

    def _options(self, job: Job) -> TurnOptions:
        r = job.request
        cfg = self.chats.controller.config
        sampling = SamplingParams(
            temperature=cfg.temperature if r.temperature is None else r.temperature,
            top_p=cfg.top_p if r.top_p is None else r.top_p,
            min_p=cfg.min_p if r.min_p is None else r.min_p,
            seed=None if r.seed is None else r.seed % 2**63,
            top_k=r.top_k or 0,
            frequency_penalty=r.frequency_penalty or 0.0,
            presence_penalty=r.presence_penalty or 0.0,
        )
        return TurnOptions(sampling=sampling, max_tokens=r.max_tokens or cfg.max_tokens, stop=r.stop,
                           cancel=job.cancel, between=self.scheduler.between, decode=self.scheduler.decode,
                           drop_partial=True, tools=r.tools, prompt=r.prompt)

    def _emitter(self, job: Job):
        """job.put, cancelling the job once its client has left `max_unread` text chunks unread."""
        def emit(event: object) -> None:
            job.put(event)
            if job.unread > self.max_unread and job.dropped is None:
                job.dropped = f"its client left {job.unread} chunks unread"
                log.warning("request cancelled: %s (a client that does not read its stream)", job.dropped)
                job.cancel.set()

        return emit

    def cancel_all(self) -> None:
        """Every running or waiting request stops at its next chunk (server shutdown)."""
        with self._lock:
            for job in self._jobs:
                job.cancel.set()

    def run_sync(self, fn, *args) -> Any:
        """Run `fn` on an engine thread, holding the baton, and wait (startup warm-up, shutdown saves)."""
        def held() -> Any:
            with self.scheduler.running():
                return fn(*args)

        return self._sync.submit(held).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._sync.shutdown(wait=True)


def _forward(event: object, emit) -> None:
    if isinstance(event, STREAMED):
        emit(event)


def _ignore(_: object) -> None:
    pass
