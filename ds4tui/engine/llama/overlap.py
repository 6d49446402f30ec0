"""Restore and forward at once: the disk fills a layer's K/V rows while the forward runs the layers before it.

Owns the pipelining of a disk hit: a reader thread fills the session's KV buffers layer
by layer, in file order (readinto releases the GIL while the disk works), and marks each
finished layer; the forward of the new message's first chunk runs on the calling thread
and waits before each layer until that layer's rows are in (`LayerGate.wait`, the
forward's `before_layer` hook). The reader writes rows < pos, the forward rows
pos..pos+S-1 of the same buffers: disjoint bytes, so neither waits on the other for
anything but the order of layers. While the reader runs, the forward's kernels run on one
thread fewer (qgemv.reserve_threads): on 2 cores the forward runs on one and the reader on
the other, instead of a job's threads waiting for the one that shares its core with the
reader.

Nothing is committed here: the caller (session.py) keeps the forward's result only
after the reader has read the whole payload and the checksum is verified. A failure
of the reader (a checksum mismatch, a short file, NaN rows) stops the forward at its
next layer and is raised on the calling thread as the reader raised it; a failure of
the forward stops the reader before its next read. Either way the read has ended when
`read_while_forward` returns or raises: no thread writes into a buffer the session has
handed on.

The reads run on one long-lived thread (`_ReadWorker`), started by the first restore and
parked between restores: starting a thread, and handing it the GIL, cost a hit ~0.3 ms on
its critical path (docs/perf-archive.md, "The disk hit: a parked reader thread"). A restore that
finds it busy (two sessions restoring at once) gets a thread of its own, as before.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

from ds4tui.engine.kernels import qgemv
from ds4tui.errors import Ds4tuiError

T = TypeVar("T")


class ReadFailed(Ds4tuiError):
    """Raised into the forward at a layer boundary when the reader has failed."""


class LayerGate:
    """How many layers the reader has filled, and whether it failed or was told to stop."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._filled = 0
        self.error: BaseException | None = None
        self.stopped = False  # set by the forward's side: the reader stops before its next read

    def filled(self, layers: int) -> None:
        with self._cond:
            self._filled = layers
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self.error = error
            self._cond.notify_all()

    def stop(self) -> None:
        self.stopped = True

    def wait(self, layer: int) -> None:
        """Block until `layer` is filled; ReadFailed when the reader failed first."""
        with self._cond:
            while self._filled <= layer and self.error is None:
                self._cond.wait()
            if self.error is not None:
                raise ReadFailed()


def read_while_forward(read: Callable[[LayerGate], None], forward: Callable[[Callable[[int], None]], T]) -> T:
    """Run `read(gate)` on a thread (it calls gate.filled(n) after each layer, checks
    gate.stopped before each read, and returns once the whole payload is read and
    verified) while `forward(before_layer)` runs here; the forward's result once both
    have succeeded. The reader's exception, when it failed, is raised as it was raised."""
    gate = LayerGate()

    def reader() -> None:
        # The reader keeps a core busy: the forward's kernels leave it one (taken before the
        # first layer is announced, so before the forward's first kernel call).
        qgemv.reserve_threads(1)
        try:
            read(gate)
        except BaseException as exc:  # handed to the calling thread, raised there
            gate.fail(exc)
        finally:
            qgemv.reserve_threads(-1)

    finished = _start(reader)
    try:
        result = forward(gate.wait)
    except ReadFailed:
        result = None  # the reader's error is raised below
    except BaseException:
        gate.stop()
        _wait(finished, gate)
        raise
    _wait(finished, gate)
    if gate.error is not None:
        raise gate.error
    return result  # type: ignore[return-value]


class _ReadWorker:
    """A parked thread that runs one read at a time; `try_run` hands it a task unless busy."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._job: tuple[Callable[[], None], threading.Event] | None = None  # handed over, not yet taken
        self._busy = False  # from try_run until the task has returned
        self._thread: threading.Thread | None = None

    def try_run(self, task: Callable[[], None]) -> threading.Event | None:
        """An event set once `task` has returned; None when the worker is busy."""
        with self._cond:
            if self._busy:
                return None
            self._busy = True
            done = threading.Event()
            self._job = (task, done)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="ds4tui-kv-restore", daemon=True)
                self._thread.start()
            self._cond.notify()
        return done

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._job is None:
                    self._cond.wait()
                (task, done), self._job = self._job, None
            try:
                task()  # the reader hands its own errors to the gate
            finally:
                with self._cond:
                    self._busy = False
                done.set()


_worker = _ReadWorker()


def _start(reader: Callable[[], None]) -> threading.Event:
    """Run `reader` on the parked worker, or on a thread of its own when that one is busy;
    the event is set once it has returned."""
    done = _worker.try_run(reader)
    if done is not None:
        return done
    done = threading.Event()

    def own() -> None:
        try:
            reader()
        finally:
            done.set()

    threading.Thread(target=own, name="ds4tui-kv-restore", daemon=True).start()
    return done


def _wait(finished: threading.Event, gate: LayerGate) -> None:
    """Wait for the read to end, even through an interrupt (KeyboardInterrupt in the main
    thread): the caller resets the session and hands its buffers on, so no read may land in
    them afterwards. The interrupt is raised once the reader has stopped."""
    interrupted: BaseException | None = None
    while not finished.is_set():
        try:
            finished.wait()
        except BaseException as exc:
            gate.stop()
            interrupted = exc
    if interrupted is not None:
        raise interrupted
