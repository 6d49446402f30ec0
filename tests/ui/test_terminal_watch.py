"""terminal_watch.terminal_gone: a live terminal, no terminal, and one hung up under a
process whose session lives on (the case where no SIGHUP comes and the app must notice)."""

from __future__ import annotations

import os
import pty
import signal
import sys
import time

import pytest

from ds4tui.screens.terminal_watch import terminal_gone

HANG_S = 120  # a guard against a hang, not a speed: under load a step can take seconds


def test_not_a_terminal_is_never_gone():
    r, w = os.pipe()
    try:
        assert terminal_gone(r) is False
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty semantics checked on Linux")
def test_a_hung_up_controlling_terminal_is_gone(tmp_path):
    out = tmp_path / "seen"
    pid, master = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        # Lives on past the hang-up, as the app does under `make run` (make keeps the
        # session, so no SIGHUP reaches it).
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            seen = []
            deadline = time.monotonic() + HANG_S
            while time.monotonic() < deadline:
                gone = terminal_gone(0)
                if not seen or seen[-1] != gone:
                    seen.append(gone)
                    out.write_text(" ".join(str(x) for x in seen))
                if gone:
                    break
                time.sleep(0.02)
        finally:
            os._exit(0)
    # The parent: wait until the child has seen its live terminal, then hang it up.
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and not (out.exists() and out.read_text()):
        time.sleep(0.02)
    assert out.read_text() == "False"
    os.close(master)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status)
    assert out.read_text() == "False True"
