"""engine/background.py: chores run at the lowest priority, only themselves, and the process
waits for them (after asking them to stop) before it shuts down."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ds4tui.engine import background

ROOT = Path(__file__).resolve().parents[2]


def test_a_chore_runs_at_the_lowest_priority_and_only_it():
    if not hasattr(os, "getpriority"):
        pytest.skip("no per-thread priorities on this platform")
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = []
    background.start(lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())), "test").join()
    assert seen == [background.BACKGROUND_NICE]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    assert not background._running  # a finished chore is forgotten


def test_the_process_stops_its_chores_and_waits_for_them_at_exit(tmp_path):
    """A chore still running when the main thread ends is told to stop and joined before the
    interpreter shuts down (one still inside a library then aborted the process)."""
    marker = tmp_path / "stopped"
    script = f"""
import time
from pathlib import Path
from ds4tui.engine import background

def chore():
    while not background.stopping():
        time.sleep(0.005)
    time.sleep(0.2)  # a last step: the exit waits for it
    Path({str(marker)!r}).write_text("yes")

background.start(chore, "test-chore")
time.sleep(0.05)
"""
    # The exit joins the chore (the marker is written) and does not hang (the timeout).
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert marker.read_text() == "yes"


def test_a_prepared_spare_stops_at_exit_and_is_not_kept():
    """prepare_session's chore checks for the exit between steps; stopped, it keeps nothing."""
    from ds4tui.engine.loader import load_model

    model = load_model("tiny-llama")
    background._stop.set()
    try:
        model._spare = None
        model.prepare_session(64, wait=True)
        assert model._spare is None and model._preparing is None
    finally:
        background._stop.clear()


def test_memory_to_spare_reads_what_the_system_has():
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo here")
    assert background.memory_to_spare(0)
    assert not background.memory_to_spare(1 << 60)  # no machine has 4 x 1 EiB available


def test_no_spare_is_prepared_when_memory_is_short(monkeypatch):
    from ds4tui.engine.loader import load_model

    model = load_model("tiny-llama")
    asked = []
    monkeypatch.setattr(background, "memory_to_spare", lambda n: asked.append(n) or False)
    model._spare = None
    model.prepare_session(64, wait=True)
    assert model._spare is None and model._preparing is None
    cfg = model.cfg
    assert asked == [2 * cfg.num_layers * 2 * cfg.num_kv_heads * 64 * cfg.head_dim]  # f16: 2 bytes
