"""The chat's start screen: each step of getting the model ready, with a bar and what it is.

Owns: showing `StartStep`s (ds4tui/chat/startup.py) as rows in a fixed order (download,
C kernels, conversion, load), a failure with its one-line reason and a Retry button,
what the app answers to a key pressed meanwhile (`say`: in the card, where a toast would
cover its title), and posting `StartProgress.RetryPressed`. It holds no engine state: the chat screen
feeds it steps from its load worker and hides it once the model is ready. Text from
files (a model's name) is shown as `Text`, never markup.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, ProgressBar, Static

from ds4tui.chat.startup import STEPS, StartStep

_MARK = {"running": "…", "done": "✓", "failed": "✗"}


class StepRow(Vertical):
    """Two lines, so that 80 columns fit the bar and its numbers:
    `✓ Download smollm2-135m-instruct from PyPI (98 MB)`
    `  ━━━━━━━━━━━━━━━╺━━━━━━━━  62%  58 of 93 MB`."""

    DEFAULT_CSS = """
    StepRow {
        height: auto;
    }
    StepRow > .step-line {
        height: 1;
        padding-left: 2;
    }
    StepRow ProgressBar {
        width: auto;
    }
    StepRow ProgressBar > Bar {
        width: 24;
    }
    StepRow .step-detail {
        width: 1fr;
        height: 1;
        padding-left: 1;
        color: $text-muted;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    StepRow.-done > .step-label {
        color: $text-success;
    }
    """

    def __init__(self, step: StartStep) -> None:
        super().__init__(id=f"step-{step.step}")
        self.last = step  # the latest shown
        self.failed = False
        self._label = Static(classes="step-label")
        self._bar = ProgressBar(total=None, show_eta=False, show_percentage=True)
        self._detail = Static(classes="step-detail")

    def compose(self) -> ComposeResult:
        yield self._label
        with Horizontal(classes="step-line"):
            yield self._bar
            yield self._detail

    def on_mount(self) -> None:
        self._draw()

    def show(self, step: StartStep) -> None:
        self.last = step
        if self.is_mounted:
            self._draw()

    def fail(self) -> None:
        """The step that was running when the start failed (a retry's next report clears it)."""
        self.failed = True
        if self.is_mounted:
            self._draw()

    def _draw(self) -> None:
        step = self.last
        mark = _MARK["failed"] if self.failed else _MARK.get(step.state, "…")
        self._label.update(Text(f"{mark} {step.label}"))
        self._detail.update(Text(step.detail, no_wrap=True, overflow="ellipsis"))
        if step.fraction is None:
            if not self.failed:
                self._bar.update(total=None)  # running, nothing to measure: the bar pulses
        else:
            self._bar.update(total=100, progress=round(100 * min(max(step.fraction, 0.0), 1.0)))
        self.set_class(step.state == "done", "-done")


class StartProgress(Vertical):
    """The rows of the start steps seen so far, and the failure, if any, below them."""

    DEFAULT_CSS = """
    StartProgress {
        height: auto;
        max-height: 60%;
        padding: 1 2;
        border: round $accent 50%;
        margin: 0 1;
    }
    StartProgress > #start-title {
        text-style: bold;
        margin-bottom: 1;
    }
    StartProgress > #start-note {
        display: none;
        margin-bottom: 1;
    }
    StartProgress > #start-note.-shown {
        display: block;
    }
    StartProgress > #start-note.-warning {
        color: $text-warning;
    }
    StartProgress > #start-note.-error {
        color: $text-error;
    }
    StartProgress > #start-error {
        color: $text-error;
        margin-top: 1;
        display: none;
    }
    StartProgress > #start-retry {
        display: none;
        margin-top: 1;
    }
    StartProgress.-failed > #start-error, StartProgress.-failed > #start-retry {
        display: block;
    }
    """

    @dataclass
    class RetryPressed(Message):
        """The user asked to try the start again after a failure."""

    def __init__(self, model: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.note = ""  # what `say` said last
        self._rows: dict[str, StepRow] = {}

    @property
    def failed(self) -> bool:
        """Whether the start failed and shows why (until a retry)."""
        return self.has_class("-failed")

    def compose(self) -> ComposeResult:
        yield Static(Text(f"Getting {self.model} ready"), id="start-title")
        yield Static(id="start-note")
        yield Static(id="start-error")
        yield Button("Retry", id="start-retry", variant="primary")

    def show_step(self, step: StartStep) -> None:
        """Add or update the row of `step.step`, keeping the rows in STEPS order."""
        row = self._rows.get(step.step)
        if row is not None:
            row.show(step)
            return
        row = self._rows[step.step] = StepRow(step)
        later = next((self._rows[s] for s in STEPS[STEPS.index(step.step) + 1:] if s in self._rows), None)
        self.mount(row, before=later or self.query_one("#start-error"))

    def say(self, text: str, severity: str = "information") -> None:
        """One line the app answers to a key pressed while it starts (the last one said stays,
        until the next): `text` is shown literally (it may quote a file's name)."""
        self.note = text
        note = self.query_one("#start-note", Static)
        note.update(Text(text))
        note.set_classes(f"-shown -{severity}")

    def show_failure(self, error: str, *, focus_retry: bool = True) -> None:
        """Mark the running step failed and show why, with the Retry button (focused unless
        the user has a draft in the message box: Enter must not lose it to a retry)."""
        for row in self._rows.values():
            if row.last.state != "done":
                row.fail()
        self.query_one("#start-error", Static).update(
            Text(f"{error}\nRetry, load another with the palette's \"Switch model\" (ctrl+p), or quit (ctrl+q).")
        )
        self.add_class("-failed")
        if focus_retry:
            self.query_one("#start-retry", Button).focus()

    def reset(self) -> None:
        """Before a retry: the failure goes; the rows stay and the steps report into them again."""
        self.remove_class("-failed")
        for row in self._rows.values():
            row.failed = False

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start-retry":
            event.stop()
            self.post_message(self.RetryPressed())
