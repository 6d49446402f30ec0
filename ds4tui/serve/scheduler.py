"""Several running requests on the engine's time: turns taken between steps, decodes batched.

Owns the baton. Each running request has a thread of its own (its turn is the chat's
ordinary blocking pipeline, chat/turn.py), but only the thread holding the baton runs: a
request gives it up at its yield points, between prefill chunks (`between`) and at each
decode step (`decode`), so the controller, the pool, the sessions and the kernels'
workspaces are only ever touched by one thread at a time, as with one engine thread.

A decode does not run at once: the request parks its (session, token) and hands the baton
on. When no request is left ready to run, every parked decode runs as one step
(engine/session.py `decode_together`: one forward over the batch where the family has one)
and the parked requests line up again in their order. So a round is one token for each
decoding request and one chunk for each prefilling one: a long prompt advances a chunk
at a time while the others stream, and no request waits for another to finish.
Admitting and retiring requests happen between rounds (continuous batching).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from ds4tui.engine.session import Session, decode_together

StepFn = Callable[[Sequence[Session], Sequence[int]], list[torch.Tensor]]


@dataclass(eq=False)
class _Parked:
    session: Session
    token: int
    logits: torch.Tensor | None = None
    error: BaseException | None = None


class Scheduler:
    def __init__(self, step: StepFn = decode_together) -> None:
        self._step = step
        self._cv = threading.Condition()
        self._owner: int | None = None  # the thread holding the baton
        self._ready: deque[int] = deque()  # threads waiting for it, in turn
        self._parked: dict[int, _Parked] = {}  # threads whose decode waits for the next step
        self.steps = 0  # batched steps run
        self.stepped = 0  # decodes they held (stepped / steps: the mean batch)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Hold the baton for the calling thread's work (a request, a warm-up, the shutdown
        saves): enter in turn, leave handing it on."""
        me = threading.get_ident()
        with self._cv:
            self._ready.append(me)
            if self._owner is None:
                self._owner = self._ready.popleft()
                self._cv.notify_all()
            self._wait_for(me)
        try:
            yield
        finally:
            self._give_up(me, None, leaving=True)

    def between(self) -> None:
        """A yield point (between prefill chunks): the others take their turn, then this goes on."""
        me = threading.get_ident()
        self._give_up(me, None, leaving=False)
        with self._cv:
            self._wait_for(me)

    def decode(self, session: Session, token: int) -> torch.Tensor:
        """`session.decode(token)`, run in the next batched step with every other parked decode."""
        me = threading.get_ident()
        parked = _Parked(session, token)
        self._give_up(me, parked, leaving=False)
        with self._cv:
            self._wait_for(me)
        if parked.error is not None:
            raise parked.error
        assert parked.logits is not None
        return parked.logits

    def _wait_for(self, me: int) -> None:
        while self._owner != me:
            self._cv.wait()

    def _give_up(self, me: int, parked: _Parked | None, leaving: bool) -> None:
        """Hand the baton on (the caller holds it). When nobody else is ready to run, the
        parked decodes run first, on this thread, which still holds the baton meanwhile."""
        with self._cv:
            assert self._owner == me, "only the baton's holder gives it up"
            if parked is not None:
                self._parked[me] = parked
            elif not leaving:
                self._ready.append(me)
            others_ready = len(self._ready) - (0 if parked is not None or leaving else 1)
            batch = None
            if others_ready == 0 and self._parked:
                batch, self._parked = self._parked, {}
        if batch is not None:
            self._run(list(batch.values()))
        with self._cv:
            if batch is not None:
                # ahead of a prefilling caller: it gets one chunk per step, not two
                self._ready.extendleft(reversed(list(batch)))  # in the order they parked
            self._owner = self._ready.popleft() if self._ready else None
            self._cv.notify_all()

    def _run(self, batch: list[_Parked]) -> None:
        try:
            logits = self._step([p.session for p in batch], [p.token for p in batch])
            for p, out in zip(batch, logits):
                p.logits = out
        except BaseException as exc:  # noqa: BLE001 - each parked request raises it in its own thread
            for p in batch:
                p.error = exc
        self.steps += 1
        self.stepped += len(batch)
