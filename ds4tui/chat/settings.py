"""The settings a running chat may change, and what follows from them.

Owns the current `Config` (replaced whole on every change, so a turn reads one
consistent snapshot) and the sampling parameters derived from it. Leaves to the
session pool applying a changed storage policy to live sessions.
"""

from __future__ import annotations

from dataclasses import replace

from ds4tui.config import Config
from ds4tui.engine.sampling import SamplingParams


class Settings:
    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()

    def update(self, **changes) -> None:
        """Sampling, max tokens, the system prompt of new chats, the SWA policy of the next saves."""
        self.config = replace(self.config, **changes)

    def sampling_params(self) -> SamplingParams:
        c = self.config
        return SamplingParams(temperature=c.temperature, top_p=c.top_p, min_p=c.min_p, seed=c.seed)
