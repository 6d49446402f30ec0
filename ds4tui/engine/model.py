"""The engine's public contract: what a loaded model and a live session look like.

The cache and the UI build on these names only (keep them stable):
`Model.info`, `Model.tokenizer`, `Model.chat`, `Model.new_session(ctx_size)`,
and the `Session` API in `session.py`. Each family (engine/llama/, engine/dsv4/) supplies
concrete classes; `loader.load_model(spec)` picks the family.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Sequence

from ds4tui.engine.session import Session


@dataclass(frozen=True)
class ModelInfo:
    """Identity of a loaded model, as the KVC header and the UI need it."""

    name: str  # display name, e.g. "smollm2-135m-instruct"
    family: str  # "llama" or "dsv4"
    model_id: int  # KVC header byte 7
    quant_bits: int  # KVC header byte 4 (bits of the source weights' quantization)
    fingerprint: bytes  # 32 bytes: SHA-256 over family, config and weight identity
    n_ctx: int  # the model's trained context length
    payload_abi: int  # KVC header byte 20

    @property
    def fingerprint_hex(self) -> str:
        return self.fingerprint.hex()


class Tokenizer(Protocol):
    """Text <-> token ids. Special tokens in text (e.g. `<|im_start|>`) map to their ids."""

    vocab_size: int
    eos_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for (may be part of a UTF-8 character)."""
        ...


class ChatTemplate(Protocol):
    """Renders messages to the exact prompt text, and parses a rendered transcript back."""

    default_system_prompt: str | None
    stop_strings: tuple[str, ...]

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True, *,
               now: datetime | None = None) -> str:
        """messages: [{"role": "system"|"user"|"assistant", "content": str}, ...]; now: the
        time a template's date comes from (a chat's own, so every turn renders the same
        date; None: the clock)."""
        ...

    def parse(self, text: str) -> list[dict]:
        """Inverse of render (without the trailing generation prompt): messages whose rendering
        gives `text` again, so a system header the template writes by itself is not read back
        as the chat's system message."""
        ...

    def written_on(self, text: str) -> datetime | None:
        """The time the template wrote into `text` (its strftime_now date), None if none."""
        ...


class Model(ABC):
    """Weights loaded once and shared by every session of this model."""

    info: ModelInfo
    tokenizer: Tokenizer
    chat: ChatTemplate

    @abstractmethod
    def new_session(self, ctx_size: int | None = None, *, kv_dtype: str | None = None) -> Session:
        """A fresh, empty session; ctx_size defaults to min(model n_ctx, a memory-friendly default).
        kv_dtype: "f16" or "f32", the type of the session's K/V (None: the family's default);
        a family with one fixed type ignores it."""

    def describe(self) -> str:
        """One line for the model info (architecture, weights, attention layout, chat format);
        families say more than this default."""
        return f"{self.info.family} model {self.info.name}"

    def release_session(self, session: Session) -> None:
        """Optional: `session` will never be used again (its chat was evicted or closed, and
        nothing else holds it); a family may hand its memory to a later new_session. The
        default does nothing (the garbage collector frees it)."""

    def prepare_session(self, ctx_size: int | None = None, *, kv_dtype: str | None = None,
                        wait: bool = False) -> None:
        """Optional: get the next new_session of `ctx_size` ready in the background (its
        memory touched), so that its first restore or prefill does not pay for that. Never
        changes a result. wait: return once it is done. The default does nothing."""

    def warm_up(self, ctx_size: int | None = None, *, kv_dtype: str | None = None) -> None:
        """Optional: pay first-use costs (page faults, library first calls) before the first
        message, e.g. in the app's model-loading worker; sessions of `ctx_size` (and kv_dtype) may start
        faster afterwards. Never changes a result. The default does nothing."""
