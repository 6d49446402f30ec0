"""Per-layer cost of a GGUF-loaded DeepSeek V4 model: `bench engine`'s DSV4 section.

Owns two runs of a fresh session (prefill, then greedy decode), with an `ExpertPager` on the
net when there is a budget: the first from a cold start (the file dropped from the page cache
and from this process, residency.forget_pages), which gives the bytes read from storage; the
second warm, with a `LayerClock`, which gives the times. What it reports:
- per layer, milliseconds per token of prefill and of decode; the rest of a decode step
  (embedding row, HC head, output head, sampling) as `head_ms`;
- bytes a decode token reads: every layer's dense weights (attention, compressors,
  indexer, router, shared expert, HC, norms) plus the distinct routed experts its router
  chose (gate, up and down rows), plus the output head and one embedding row; the roofline
  of docs/perf.md divides this by a memory bandwidth;
- bytes read from storage per decode token (/proc/self/io) and the process's resident set
  (VmRSS, and its file-backed part) at the end, with the pager's evictions and read-aheads.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from ds4tui.engine.dsv4 import paging, residency
from ds4tui.engine.dsv4.linear import ExpertBank
from ds4tui.engine.kernels.qgemv import QuantMatrix


@dataclass
class Dsv4LayerBench:
    layers: int
    prefill_tokens: int
    decode_tokens: int
    prefill_ms: list[float]  # per layer, per prompt token
    decode_ms: list[float]  # per layer, per decoded token
    decode_cpu_ms: list[float]  # the same in CPU time (all threads)
    head_ms: float  # per decoded token: the step outside the layers
    dense_bytes: list[int]  # per layer (a hash layer's tid2eid: one row)
    expert_unit_bytes: int  # one expert's gate + up + down rows
    experts_per_token: list[float]  # per layer: distinct experts a decode token used (mean)
    head_bytes: int  # output head, its HC, the final norm, one embedding row
    bytes_per_token: float  # what one decode token reads in all
    storage_read_per_token: float  # bytes read from storage per decode token (cold start)
    cold_decode_ms: float  # per decode token, that cold run (the per-layer times are a warm run's)
    rss_bytes: int
    rss_file_bytes: int
    expert_budget: int | None = None
    evicted: int = 0
    prefetched: int = 0
    notes: list[str] = field(default_factory=list)


def _weight_bytes(obj) -> int:
    """Bytes of every matrix and tensor under a weights dataclass, routed experts left out."""
    if isinstance(obj, ExpertBank):
        return 0
    if isinstance(obj, QuantMatrix):
        return obj.nbytes
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if dataclasses.is_dataclass(obj):
        total = 0
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name == "tid2eid" and isinstance(v, torch.Tensor):
                total += v.shape[1] * v.element_size()  # a token reads its own row
            else:
                total += _weight_bytes(v)
        return total
    if isinstance(obj, (list, tuple)):
        return sum(_weight_bytes(x) for x in obj)
    return 0


class _Routes(paging.LayerObserver):
    """Distinct experts per decode step and layer."""

    def __init__(self, n_layers: int) -> None:
        self.decode_counts: list[list[int]] = [[] for _ in range(n_layers)]

    def routed(self, layer: int, ids: torch.Tensor) -> None:
        if ids.shape[0] == 1:
            self.decode_counts[layer].append(len(set(ids.flatten().tolist())))


def measure_dsv4_layers(model, prompt: list[int], decode_tokens: int, expert_budget: int | None = None,
                        cold: bool = True) -> Dsv4LayerBench:
    cfg, w = model.cfg, model.net.w
    n = cfg.num_hidden_layers
    clock, routes = paging.LayerClock(n), _Routes(n)
    pager = paging.ExpertPager(model, expert_budget) if expert_budget else None
    notes = []
    if cold and residency.available():
        residency.forget_pages(model)
    elif cold:
        notes.append("not cold: no /proc/self/pagemap")
    base = [pager] if pager else []
    model.net.observers.extend(base)

    def run(extra: list) -> tuple[float, int]:
        """(decode seconds, storage bytes read while decoding) of one fresh session."""
        model.net.observers.extend(extra)
        try:
            s = model.new_session(len(prompt) + decode_tokens + 1)
            s.prefill(prompt)
            read0, t0 = paging.disk_read_bytes(), time.perf_counter()
            for _ in range(decode_tokens):
                s.decode(int(s.logits.argmax()))
            return time.perf_counter() - t0, paging.disk_read_bytes() - read0
        finally:
            for o in extra:
                model.net.observers.remove(o)

    try:
        cold_s, read = run([routes])  # what a fresh start reads from storage
        decode_s, _ = run([clock])  # the steady state: per-layer times
    finally:
        for o in base:
            model.net.observers.remove(o)
        if pager:
            pager.close()
    mem = paging.process_memory()
    unit = sum(getattr(w.layers[0].moe, k).expert_bytes for k in ("w1", "w3", "w2"))
    dense = [_weight_bytes(lw) for lw in w.layers]
    per_tok = [sum(c) / len(c) if c else 0.0 for c in routes.decode_counts]
    embed_row = w.embed.shape[1] * w.embed.element_size()
    head = _weight_bytes(w.head) + _weight_bytes(w.hc_head) + _weight_bytes(w.norm) + embed_row
    d = max(decode_tokens, 1)
    decode_ms = [1e3 * t / d for t in clock.decode_s]
    return Dsv4LayerBench(
        layers=n, prefill_tokens=len(prompt), decode_tokens=decode_tokens,
        prefill_ms=[round(1e3 * t / max(len(prompt), 1), 2) for t in clock.prefill_s],
        decode_ms=[round(x, 2) for x in decode_ms],
        decode_cpu_ms=[round(1e3 * t / d, 2) for t in clock.decode_cpu_s],
        head_ms=round(1e3 * decode_s / d - sum(decode_ms), 2),
        dense_bytes=dense, expert_unit_bytes=unit, experts_per_token=[round(x, 2) for x in per_tok],
        head_bytes=head, bytes_per_token=float(sum(dense) + unit * sum(per_tok) + head),
        storage_read_per_token=round(read / d, 1), cold_decode_ms=round(1e3 * cold_s / d, 2), rss_bytes=mem["VmRSS"], rss_file_bytes=mem["RssFile"],
        expert_budget=expert_budget, evicted=pager.evicted if pager else 0,
        prefetched=pager.prefetched if pager else 0, notes=notes,
    )


def format_rows(b: Dsv4LayerBench) -> list[tuple[str, str]]:
    """`bench engine`'s text rows for the DSV4 section."""
    gb = 1e9
    rows = []
    for li in range(b.layers):
        rows.append((f"layer {li}", f"prefill {b.prefill_ms[li]:.2f} ms/token, decode {b.decode_ms[li]:.2f} ms/token "
                                    f"({b.decode_cpu_ms[li]:.2f} ms CPU), "
                                    f"reads {(b.dense_bytes[li] + b.experts_per_token[li] * b.expert_unit_bytes) / 1e6:.1f} MB"
                                    f"/token ({b.dense_bytes[li] / 1e6:.1f} MB dense + {b.experts_per_token[li]:g} experts"
                                    f" x {b.expert_unit_bytes / 1e6:.2f} MB)"))
    rows.append(("head", f"decode {b.head_ms:.2f} ms/token (output head, HC head, embedding row, sampling), "
                         f"reads {b.head_bytes / 1e6:.1f} MB/token"))
    rows.append(("reads", f"{b.bytes_per_token / gb:.3f} GB per decode token; from storage {b.storage_read_per_token / 1e6:.1f}"
                          f" MB per decode token at {b.cold_decode_ms:.0f} ms/token (cold start, {b.decode_tokens} tokens;"
                          f" the layer times above: warm)"))
    budget = "no expert budget" if not b.expert_budget else (
        f"expert budget {b.expert_budget / gb:.2f} GB: {b.evicted} experts evicted, {b.prefetched} read ahead")
    rows.append(("memory", f"RSS {b.rss_bytes / gb:.2f} GB ({b.rss_file_bytes / gb:.2f} GB of it file pages); {budget}"))
    return rows
