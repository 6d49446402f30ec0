"""Every error the engine raises on purpose; the layers above catch `EngineError`."""

from __future__ import annotations

from ds4tui.errors import Ds4tuiError


class EngineError(Ds4tuiError):
    """Base of every error the engine raises on purpose (bad weights, bad payload, full context)."""


class WeightsError(EngineError):
    """A checkpoint that cannot be loaded: the message names the tensor or file."""


class ModelNotFoundError(EngineError):
    """The model spec names nothing on disk; the message says which command fetches it."""


class PullCancelled(ModelNotFoundError):
    """A model download stopped by the user; nothing of it is left on disk."""


class ContextFullError(EngineError):
    """The session has no room for the requested tokens."""


class PayloadError(EngineError):
    """A payload that cannot be restored into this session; the message says exactly why.

    Raising it leaves the session as it was before the load (reset to empty if
    the failure was detected after state was touched), never half-restored.
    """
