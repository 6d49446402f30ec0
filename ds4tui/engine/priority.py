"""The engine's background chores run at the lowest priority: `lower_this_thread`.

Moving the weights into huge pages and touching the next session's KV buffers are head
starts, not work anyone waits for; on a 2-core machine they would otherwise take a core
from a disk hit's forward or a decode that starts meanwhile. At nice 19 they get a core
only when nothing else wants it.
"""

from __future__ import annotations

import os
import threading

BACKGROUND_NICE = 19


def lower_this_thread() -> None:
    """Put the calling thread (on Linux a thread has its own nice value) at the lowest
    priority; where the platform has no per-thread priority, nothing happens."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):
        pass
