"""The engine's background chores: at the lowest priority, and over before the process exits.

Owns `start(target, name)`, which runs a chore on a daemon thread at nice 19, the exit
hook that asks running chores to stop (`stopping()`) and waits for them, and
`memory_to_spare`, which a chore that allocates asks first. Moving the weights
into huge pages and touching the next session's KV buffers are head starts nobody waits
for; on a 2-core machine they would otherwise take a core from a disk hit's forward or a
decode that starts meanwhile. At nice 19 they get a core only when nothing else wants one.

Why the exit hook: a chore still running while the interpreter shuts down (the process
ends right after a reply, as `bench cache`'s sides do) aborted it ("terminate called
without an active exception", 2 exits in 8); a chore checks `stopping()` between steps
and the hook joins it before shutdown starts tearing down the libraries it is in.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Callable

BACKGROUND_NICE = 19
EXIT_WAIT_S = 10.0  # a chore's step is a few milliseconds: this is only a bound
# A chore that takes memory (the next session's buffers) runs only while the system has this
# many times that much available: a head start is never worth memory pressure.
SPARE_HEADROOM = 4

_stop = threading.Event()
_running: set[threading.Thread] = set()
_lock = threading.Lock()


def lower_this_thread() -> None:
    """Put the calling thread (on Linux a thread has its own nice value) at the lowest
    priority; where the platform has no per-thread priority, nothing happens."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):
        pass


def memory_to_spare(nbytes: int) -> bool:
    """Whether a head start may hold `nbytes` more: the system's available memory (Linux's
    MemAvailable) is at least SPARE_HEADROOM times that; True where it cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024 >= SPARE_HEADROOM * nbytes
    except (OSError, ValueError, IndexError):
        pass
    return True


def stopping() -> bool:
    """Whether the process is exiting: a chore stops at its next step."""
    return _stop.is_set()


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """Run `target()` as a background chore; the thread is returned (started)."""

    def run() -> None:
        lower_this_thread()
        try:
            target()
        finally:
            with _lock:
                _running.discard(threading.current_thread())

    thread = threading.Thread(target=run, name=name, daemon=True)
    with _lock:
        _running.add(thread)
    thread.start()
    return thread


@atexit.register
def _finish_chores() -> None:
    _stop.set()
    with _lock:
        running = list(_running)
    for thread in running:
        thread.join(EXIT_WAIT_S)
