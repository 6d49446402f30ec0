"""The settings a running chat may change, and what follows from them.

Owns the current `Config` (replaced whole on every change, so a turn reads one
consistent snapshot) and the sampling parameters derived from it. Leaves to the
session pool applying a changed storage policy to live sessions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ds4tui.config import Config
from ds4tui.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from ds4tui.chat.conversation import Conversation

# The settings one chat may override (F3 applies to the active chat; new chats take the config).
CHAT_KEYS = ("temperature", "top_p", "min_p", "max_tokens", "seed")


class Settings:
    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()

    def update(self, **changes) -> None:
        """Sampling, max tokens, the system prompt of new chats, the SWA policy of the next saves."""
        self.config = replace(self.config, **changes)

    def value(self, key: str, conv: "Conversation | None" = None):
        """One setting as `conv` sees it: its own override, else the config's."""
        if conv is not None and key in conv.overrides:
            return conv.overrides[key]
        return getattr(self.config, key)

    def sampling_params(self, conv: "Conversation | None" = None) -> SamplingParams:
        v = lambda k: self.value(k, conv)  # noqa: E731
        return SamplingParams(temperature=v("temperature"), top_p=v("top_p"), min_p=v("min_p"), seed=v("seed"))

    def max_tokens(self, conv: "Conversation | None" = None) -> int:
        return int(self.value("max_tokens", conv))
