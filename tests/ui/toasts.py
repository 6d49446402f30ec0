"""Every toast a test app shows, kept: Textual drops a toast when its timeout passes (5 s by
default), and on a busy machine that can happen before the test looks at it."""

from __future__ import annotations

from textual.notifications import Notification


class KeepsToasts:
    """Mixed into a test App: `toasts` lists each notification since the last clear."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.toasts: list[Notification] = []

    def notify(self, message: str, *, title: str = "", severity="information", timeout: float | None = None,
               markup: bool = True) -> None:
        self.toasts.append(Notification(message, title, severity, timeout or 0.0, markup=markup))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)  # type: ignore[misc]

    def clear_notifications(self) -> None:
        self.toasts.clear()
        super().clear_notifications()  # type: ignore[misc]
