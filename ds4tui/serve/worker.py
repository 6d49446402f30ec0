"""The server's engine: one thread runs requests in arrival order, a bounded line waits.

Owns: admitting a request (or refusing it when `max_waiting` already wait: the
server answers 429), running it on the one engine thread with its own cancel
flag, handing the turn's events to the event loop as they happen, the
Retry-After estimate, and the counters /health shows. One thread because one
forward already uses every core the engine has; a second would only slow both.
Leaves the mapping of requests to sessions to chat/stateless.py.
"""

from __future__ import annotations

import asyncio
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

STREAMED = (PrefillStarted, PrefillProgress, TokenText)  # what a streaming client is shown
RECENT_WEIGHT = 0.2  # of the newest request in the running mean Retry-After is based on
FIRST_GUESS_S = 1.0  # that mean before any request has finished
# Retry-After is the expected wait times a random factor in [1, 1 + JITTER): refused clients
# come back spread out instead of all at once (into a line that is full again).
JITTER = 1.0


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

    def put(self, item: object) -> None:
        """From the engine thread: queue an item for the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is gone (server shutting down): nobody is listening
            pass


class EngineQueue:
    def __init__(self, chats: StatelessChats, max_waiting: int, rng: random.Random | None = None) -> None:
        self.chats = chats
        self.max_waiting = max_waiting
        self.counters = Counters()
        self._rng = rng or random.Random()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ds4tui-engine")
        self._lock = threading.Lock()
        self._pending = 0  # running + waiting
        self._running = False
        self._jobs: set[Job] = set()

    def state(self) -> dict[str, Any]:
        with self._lock:
            running = int(self._running)
            return {"running": running, "waiting": self._pending - running,
                    "max_waiting": self.max_waiting, **self.counters.as_dict()}

    def submit(self, request: ChatRequest) -> Job | None:
        """Queue a request (call on the event loop); None when the line is full."""
        with self._lock:
            if self._pending >= 1 + self.max_waiting:
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

    def check_prompt(self, request: ChatRequest) -> None:
        """RequestError when the request cannot run: its prompt does not fit the context, or the
        chat template refuses its messages. Any thread (it renders and encodes only)."""
        try:
            n = self.chats.prompt_tokens(request.messages)
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
            wait = self.counters.recent_s * max(1, self._pending)
        return wait * (1.0 + JITTER * self._rng.random())

    def _run(self, job: Job) -> None:
        with self._lock:
            self._running = True
        started = time.perf_counter()
        result: Completion | None = None
        error: BaseException | None = None
        try:
            if not job.cancel.is_set():  # the client left while waiting: nothing to do
                emit = job.put if job.request.stream else _ignore
                result = self.chats.complete(job.request.messages, lambda e: _forward(e, emit),
                                             self._options(job))
        except Exception as exc:  # reported to the client; the engine goes on
            error = exc
        finally:
            with self._lock:
                self._running = False
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
                           cancel=job.cancel)

    def cancel_all(self) -> None:
        """Every running or waiting request stops at its next chunk (server shutdown)."""
        with self._lock:
            for job in self._jobs:
                job.cancel.set()

    def run_sync(self, fn, *args) -> Any:
        """Run `fn` on the engine thread and wait (startup warm-up, shutdown saves)."""
        return self._executor.submit(fn, *args).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def _forward(event: object, emit) -> None:
    if isinstance(event, STREAMED):
        emit(event)


def _ignore(_: object) -> None:
    pass
