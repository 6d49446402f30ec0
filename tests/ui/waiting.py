"""Waiting in Pilot tests for a state, not for a time: the deadline only stops a hang.

HANG_S is long on purpose: on a busy 2-core machine a step that takes 50 ms alone can take
seconds, and a test that fails for that says nothing about the app.
"""

from __future__ import annotations

import asyncio

import pytest

HANG_S = 120.0


async def until(pilot, condition, what: str, timeout: float = HANG_S) -> None:
    """Let the app run until `condition()` holds; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)


async def until_settled(pilot, probe, condition, what: str, timeout: float = HANG_S, *, calm: int = 3) -> None:
    """Until `condition()` holds and `probe()` (layout state) stays the same over `calm`
    pauses in a row: a state a screenshot can take, not a frame in the middle of a layout (on
    a busy machine one pause was not enough: a later reflow moved the log after it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    steady = 0
    while True:
        before = probe()
        await pilot.pause(0.05)
        steady = steady + 1 if condition() and probe() == before else 0
        if steady >= calm:
            return
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what} to settle")
