"""The state of a DeepSeek V4 session that its payload and SWA code work on.

`Dsv4State` is the part of `Dsv4Session` that payload.py (the sections on disk) and
swa.py (what a save stores, how a load rebuilds) read and drive; naming it here keeps
those modules from importing the session, which imports them. `SwaState` is the
per-session SWA bookkeeping (what the last load did is engine/swa_layout.py's `RestoreInfo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from ds4tui.engine.dsv4.cache import LayerCache
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.model import ModelInfo
from ds4tui.engine.session import ProgressFn, StopFn
from ds4tui.engine.swa_layout import RestoreInfo
from ds4tui.format.swa_policy import FULL_POLICY, SwaPolicy


@dataclass
class SwaState:
    policy: SwaPolicy = FULL_POLICY
    snapshot_at: int | None = None  # position of the periodic snapshot
    snapshot: list[torch.Tensor] | None = None  # per layer [min(P, W), head_dim], oldest first
    replaying: bool = False
    last_restore: RestoreInfo | None = None

    def forget(self) -> None:
        self.snapshot_at = self.snapshot = self.last_restore = None


class Dsv4State(Protocol):
    cfg: Dsv4Config
    info: ModelInfo  # the fingerprint and name a payload is checked against
    layers: list[LayerCache]
    tokens: list[int]
    logits: torch.Tensor | None
    ctx_size: int
    chunk_size: int
    swa: SwaState

    def prefill(self, tokens: Sequence[int], on_progress: ProgressFn | None = None,
                should_stop: StopFn | None = None) -> bool: ...

    def next_logits(self) -> torch.Tensor | None: ...
