"""The one base of every error ds4tui raises on purpose: `Ds4tuiError`.

An expected failure (a bad file, a missing model, a refused setting, a server that does not
answer) is a `Ds4tuiError` whose message is one line a user can act on; the command line
prints it as `ds4tui: <message>` (exit status 1) and the UI shows it in a notice, neither with
a traceback. Anything else is a bug and keeps its traceback. Each layer's own classes
(`EngineError`, `KvcFormatError`, `StoreError`, `CliError`, ...) derive from it and keep
their other bases (`ValueError`, `OSError`) for the callers that catch those.

Imports nothing, so every layer may import it (tests/test_layers.py allows exactly this one).
"""


class Ds4tuiError(Exception):
    """An expected failure, its message one line for the user (no traceback)."""


def error_line(exc: BaseException) -> str:
    """What the user is shown for `exc`: an expected failure's own message; anything else (a
    bug) prefixed by its type, so a report can name it, still on one line, never a traceback."""
    if isinstance(exc, Ds4tuiError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
