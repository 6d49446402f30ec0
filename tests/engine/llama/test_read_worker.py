"""overlap.read_while_forward's reader thread: one parked thread serves restore after restore;
a restore that finds it busy reads on a thread of its own; a failure reaches the caller."""

from __future__ import annotations

import threading
import time

import pytest

from ds4tui.engine.llama import overlap


def _restore(reads_on: list, layers: int = 3, release: threading.Event | None = None):
    """read_while_forward over `layers` layers; notes the reader's thread in `reads_on`."""
    def read(gate: overlap.LayerGate) -> None:
        reads_on.append(threading.current_thread())
        if release is not None:
            release.wait(5)
        for n in range(1, layers + 1):
            gate.filled(n)

    def forward(before_layer) -> list[int]:
        seen = []
        for i in range(layers):
            before_layer(i)
            seen.append(i)
        return seen

    return overlap.read_while_forward(read, forward)


def test_restores_one_after_another_read_on_the_same_parked_thread():
    reads_on: list = []
    assert _restore(reads_on) == [0, 1, 2]
    assert _restore(reads_on) == [0, 1, 2]
    assert len(reads_on) == 2 and reads_on[0] is reads_on[1]
    assert reads_on[0] is not threading.current_thread() and reads_on[0].is_alive()


def test_a_restore_that_finds_the_thread_busy_gets_its_own():
    reads_on: list = []
    release = threading.Event()
    first = threading.Thread(target=_restore, args=(reads_on, 3, release))
    first.start()
    while not reads_on:  # the parked thread is now inside the first restore's read
        time.sleep(0.001)
    assert _restore(reads_on) == [0, 1, 2]  # does not wait for the first one
    release.set()
    first.join(5)
    assert len(reads_on) == 2 and reads_on[0] is not reads_on[1]
    assert _restore(reads_on) == [0, 1, 2] and reads_on[2] is reads_on[0]  # parked again


def test_the_readers_error_is_raised_to_the_caller_and_the_thread_serves_the_next():
    def read(gate: overlap.LayerGate) -> None:
        gate.filled(1)
        raise OSError("disk went away")

    def forward(before_layer) -> None:
        for i in range(3):
            before_layer(i)

    with pytest.raises(OSError, match="disk went away"):
        overlap.read_while_forward(read, forward)
    reads_on: list = []
    assert _restore(reads_on) == [0, 1, 2]
