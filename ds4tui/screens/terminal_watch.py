"""Noticing that the app's terminal is gone.

Owns: `terminal_gone`, whether the terminal on a file descriptor has been hung up. A
terminal window closed (or its tmux server killed) while a parent such as `make run` keeps
the session alive sends no SIGHUP to the app; Textual's input reader then reads end-of-file
over and over and the process would spin on, unseen, at ~100% CPU. The apps check once a
second and quit as ctrl+q does (the chat saves its live sessions first).
"""

from __future__ import annotations

import errno
import os
import sys

CHECK_EVERY_S = 1.0


def terminal_gone(fd: int | None = None) -> bool:
    """True when `fd` (default: stdin) is a terminal that has been hung up (EIO); False for a
    live terminal and for anything that is not a terminal (a pipe, the tests' headless apps)."""
    if fd is None:
        stream = sys.__stdin__
        if stream is None:
            return False
        try:
            fd = stream.fileno()
        except (OSError, ValueError):
            return False
    try:
        os.tcgetpgrp(fd)
    except OSError as exc:
        return exc.errno == errno.EIO
    return False
