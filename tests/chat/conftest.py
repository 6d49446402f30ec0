"""Fixtures for the chat controller: tiny seeded models loaded once per module, small policies.

The policy shrinks ds4's numbers (512-token minimum, 2048 alignment, 10240
frontier) to sizes a 2048-context tiny model reaches in a few hundred tokens,
so every checkpoint kind happens within one short test.
"""

from __future__ import annotations

import pytest

from ds4tui.cache.policy import CachePolicy
from ds4tui.chat import events as ev
from ds4tui.config import Config
from ds4tui.chat.controller import ChatController

SMALL_POLICY = CachePolicy(min_tokens=32, boundary_trim_tokens=4, boundary_align_tokens=64,
                           continued_interval_tokens=128)

# ~200 tokens with tiny-llama's tokenizer: long enough for cold + continued checkpoints.
LONG_PROMPT = "Please summarize the following notes about the capital of France. " * 12

# What a ChatML turn forwards after its reply for the next user message (chat/next_turn.py).
CHATML_OPENING = "<|im_end|>\n<|im_start|>user\n"


def opening_tokens(model) -> int:
    """Tokens the tiny model's session holds past a reply once the next turn is opened."""
    return len(model.tokenizer.encode(CHATML_OPENING))


@pytest.fixture(scope="session")
def tiny_llama():
    from ds4tui.engine.loader import load_model

    return load_model("tiny-llama")


def make_controller(model, tmp_path=None, policy=SMALL_POLICY, **config) -> ChatController:
    """A greedy controller; tmp_path given: its own cache dir (else the test's $DS4TUI_CACHE_DIR)."""
    values = dict(model=model.info.name, temperature=0.0, max_tokens=8)
    if tmp_path is not None:
        values["cache_dir"] = str(tmp_path)
    values.update(config)
    return ChatController(model, Config(**values), policy=policy)


class Recorder(list):
    """Collects events (call it with one); `of(Type)` filters them."""

    def __call__(self, event) -> None:
        self.append(event)

    def of(self, kind):
        return [e for e in self if isinstance(e, kind)]

    @property
    def reply(self) -> str:
        return "".join(e.text for e in self.of(ev.TokenText))


@pytest.fixture
def recorder():
    return Recorder()
