"""The cache browser's detail pane: everything one `.kv` file holds, decoded.

Owns: the annotated hex of the 52 header bytes, the decoded fields (names,
local and relative times), the eviction score and its parts, the resume cost,
the DSV4 payload header, the trailers and the text preview. All of it is
built from rich `Text` objects: text from a file is never parsed as
markup and its control codes are shown as escapes (`kv_format`).
Leaves to callers: reading the file (`KvDetailInfo` is filled off the UI thread).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from ds4tui.cache.entry import KvEntry
from ds4tui.format.kvc import HEADER_FIELDS, PREFIX_BYTES, payload_abi_name
from ds4tui.format.payload import DS4TUI_PAYLOAD_ABI
from ds4tui.format.swa_policy import describe_payload, payload_kv_dtype, payload_row_order
from ds4tui.format.display import human_bytes, local_time, relative_time, score_text
from ds4tui.screens.widgets.kv_format import ResumeCost, duration, file_text, reason_label, safe_cell

# Alternating styles tell neighbouring fields apart in the hex dump.
_FIELD_STYLES = ("cyan", "magenta", "green", "yellow")
_UINT = {1: "<B", 4: "<I", 8: "<Q"}


@dataclass(frozen=True)
class KvDetailInfo:
    """What the pane shows for one file; built in a worker, shown on the UI thread."""

    entry: KvEntry
    raw_header: bytes  # the file's first bytes, up to 52 (fewer for a truncated file)
    now: float
    cost: ResumeCost | None = None
    fingerprint: bytes | None = None  # ds4tui payloads only: the writing model's identity
    model_fingerprint: bytes | None = None  # the running model's, when there is one
    resume_block: str | None = None  # why resume is refused here; None when it would load
    name: str | None = None  # what the table calls it (untitled: the chat it belongs to, or its first message)
    chat_saves: tuple[int, ...] = ()  # created_at of every file of the same chat (this one included)


TIMELINE_WIDTH = 36


def timeline(info: KvDetailInfo) -> Text:
    """One line of time, oldest left: ● created, ○ each save of the same chat, ◆ last used;
    then what the marks are, in words."""
    h = info.entry.header
    if h is None:
        return Text("—", style="dim")
    marks = [(t, "○", "cyan") for t in info.chat_saves if t and t != h.created_at]
    marks.append((h.created_at, "●", "green"))
    if h.last_used:
        marks.append((h.last_used, "◆", "magenta"))
    lo = min(t for t, _, _ in marks)
    hi = max(max(t for t, _, _ in marks), lo + 1)
    cells = ["─"] * TIMELINE_WIDTH
    styles = ["dim"] * TIMELINE_WIDTH
    for t, mark, style in sorted(marks, key=lambda m: m[1] != "○"):  # created/last used drawn last
        i = round((t - lo) / (hi - lo) * (TIMELINE_WIDTH - 1))
        cells[i], styles[i] = mark, style
    out = Text(no_wrap=True)
    for ch, style in zip(cells, styles):
        out.append(ch, style)
    saves = len([t for t in info.chat_saves if t])
    out.append(f"\n● created {relative_time(h.created_at, info.now)}", "green")
    if saves > 1:
        out.append(f"  ○ {saves} saves of this chat", "cyan")
    out.append(f"  ◆ last used {relative_time(h.last_used, info.now)}", "magenta")
    return out


def _field_value(raw: bytes, offset: int, size: int, name: str) -> str:
    chunk = raw[offset:offset + size]
    if len(chunk) < size:
        return "(missing)"
    if name == "magic":
        return repr(chunk)[1:]
    if name == "reserved":
        return "0" if chunk == bytes(size) else f"{chunk.hex()} (not zero)"
    if name == "ext_flags":
        return f"0b{chunk[0]:08b}"
    return str(struct.unpack(_UINT[size], chunk)[0])


def hex_table(raw: bytes) -> Text:
    """One line per header field: offset, its bytes in hex, name, raw value.

    Plain fixed-width `Text` rather than a rich `Table`: the pane is redrawn on
    every selection change and tables cost far more to measure and render."""
    out = Text("off  bytes (hex)                field         raw value\n", style="bold")
    for i, (offset, size, name) in enumerate(HEADER_FIELDS):
        style = _FIELD_STYLES[i % len(_FIELD_STYLES)]
        chunk = raw[offset:offset + size]
        out.append(f"{offset:>3}  ")
        out.append(f"{chunk.hex(' ') or '—':<23}", style)
        out.append("  ")
        out.append(f"{name:<13}", style)
        out.append(" " + _field_value(raw, offset, size, name) + "\n")
    out.rstrip()
    return out


def hex_dump(raw: bytes, per_row: int = 16) -> Text:
    """The bytes `per_row` per line (16, or 8 in a narrow pane, so a row never wraps),
    each field in its own colour (same colours as the table)."""
    style_at = []
    for i, (_, size, _) in enumerate(HEADER_FIELDS):
        style_at += [_FIELD_STYLES[i % len(_FIELD_STYLES)]] * size
    out = Text(no_wrap=True)
    for line_start in range(0, len(raw), per_row):
        out.append(f"{line_start:04x}  ", "dim")
        for j, b in enumerate(raw[line_start:line_start + per_row]):
            out.append(f"{b:02x}", style_at[line_start + j])
            out.append(" ")
        out.append("\n")
    out.rstrip()
    return out


def _kv(rows: list[tuple[str, Text | str]]) -> Text:
    """`key  value` lines with the keys padded to one width."""
    width = max((len(k) for k, _ in rows), default=0)
    out = Text()
    for k, v in rows:
        out.append(f"{k:<{width}}  ", "bold")
        out.append_text(v if isinstance(v, Text) else Text(v))
        out.append("\n")
    out.rstrip()
    return out


def _when(ts: int, now: float) -> str:
    return f"{local_time(ts, seconds=True)} ({relative_time(ts, now)})" if ts else "never"


def decoded_section(info: KvDetailInfo) -> Text:
    e, h = info.entry, info.entry.header
    rows: list[tuple[str, Text | str]] = [("file", Text(f"{e.sha or '?'}.kv  {human_bytes(e.file_bytes)}"))]
    if h is None:
        return _kv(rows)
    flags = ", ".join(h.ext_flag_names) or "none"
    rows += [
        ("reason", f"{reason_label(h.reason)} ({h.reason}, {h.reason_code})" if reason_label(h.reason) != h.reason
                   else f"{h.reason} ({h.reason_code})"),
        ("ext flags", f"{flags} (0x{h.ext_flags:02x})"),
        ("model", f"{e.model} (id {h.model_id:#04x})"),
        ("payload ABI", f"{h.payload_abi} ({payload_abi_name(h.payload_abi)})"),
        ("quant bits", str(h.quant) + (" (ds4tui mark set: ds4 skips the file)" if h.quant != h.quant_bits else "")),
        ("tokens / ctx", f"{h.tokens} / {h.ctx_size}"),
        ("hits", str(h.hits)),
        ("created", _when(h.created_at, info.now)),
        ("last used", _when(h.last_used, info.now)),
        ("text", human_bytes(h.text_bytes)),
        ("payload", human_bytes(h.payload_bytes)),
    ]
    if info.fingerprint is not None:
        fp = info.fingerprint.hex()[:16] + "…"
        if info.model_fingerprint is not None:
            same = info.fingerprint == info.model_fingerprint
            rows.append(("fingerprint", Text(fp + (" (this model)" if same else " (another model)"),
                                             style="green" if same else "yellow")))
        else:
            rows.append(("fingerprint", fp))
    return _kv(rows)


def score_section(info: KvDetailInfo) -> Text:
    e = info.entry
    s = e.score
    if s is None:
        return _kv([("score", "—")])
    rows: list[tuple[str, Text | str]] = [
        ("score", f"{score_text(s.score)} per MiB (lowest goes first)"),
        ("effective hits", f"{s.effective_hits:.2f} (hits halve every 6 h unused)"),
        ("anchor weight", f"{s.anchor_weight:g}"),
        ("superseded", f"×{s.superseded_factor:.2f}" + (" (a newer file covers it)" if e.superseded else "")),
    ]
    if e.pinned:
        rows.append(("pinned", Text("never evicted", style="bold magenta")))
    return _kv(rows)


def cost_section(info: KvDetailInfo) -> Text:
    c = info.cost
    rows: list[tuple[str, Text | str]] = []
    if c is not None:
        rows += [
            ("load", f"{human_bytes(c.load_bytes)} ≈ {duration(c.load_s)} at {c.disk_mb_s:g} MB/s"),
            ("cold prefill", f"{c.tokens} tokens ≈ {duration(c.prefill_s)} at {c.prefill_tok_s:g} tok/s"),
            ("saves", f"≈ {duration(max(c.saved_s, 0.0))}"),
        ]
    if info.resume_block:
        rows.append(("resume", safe_cell(info.resume_block, 200, "yellow")))
    elif info.entry.header is not None:
        rows.append(("resume", Text("loadable here (enter)", style="green")))
    return _kv(rows)


def payload_section(info: KvDetailInfo) -> Text:
    p = info.entry.payload
    if not p:
        return _kv([("payload", "no DSV4 header" if info.entry.header else "—")])
    rows: list[tuple[str, Text | str]] = [
        (name, f"0x{value:08x} (DSV4)" if name == "magic" else str(value)) for name, value in p.items()
    ]
    header = info.entry.header
    if header is not None and header.payload_abi == DS4TUI_PAYLOAD_ABI:
        # Only ds4tui's payloads tag payload_version with the SWA storage policy.
        rows.append(("swa_policy", describe_payload(p, header.model_id)))
        rows.append(("kv_dtype", payload_kv_dtype(p, header.model_id)))
        rows.append(("kv_rows", payload_row_order(p, header.model_id)))
    return _kv(rows)


def trailer_section(info: KvDetailInfo) -> Text:
    e = info.entry
    t = e.trailers or {}
    rows: list[tuple[str, Text | str]] = [("title", safe_cell(e.title, 80, "bold") if e.title is not None else Text("—"))]
    tm = t.get("tool_map")
    if tm:
        ids = ", ".join(tm.get("ids", [])[:6]) + (" …" if tm.get("count", 0) > 6 else "")
        rows.append(("tool map", safe_cell(f"{tm['count']} ids, {tm['dsml_bytes']} B DSML: {ids}", 120)))
    else:
        rows.append(("tool map", "—"))
    checksum = {"ok": Text("ok (xxh3)", style="green"), "mismatch": Text("mismatch", style="bold red"),
                "none": Text("none (ds4 file, or written before checksums)", style="dim"),
                "unchecked": Text("present, not checked yet", style="dim")}.get(e.checksum)
    if checksum is not None:
        rows.append(("checksum", checksum))
    if t:
        rows.append(("trailer bytes", str(t.get("trailer_bytes", 0))))
        if t.get("extra_bytes"):
            rows.append(("extra bytes", Text(f"{t['extra_bytes']} after the trailers", style="yellow")))
    return _kv(rows)


def status_line(info: KvDetailInfo) -> Text:
    e = info.entry
    head = Text()
    if e.title is not None:
        head.append_text(safe_cell(e.title, 80, "bold"))
        head.append("  ")
    elif info.name:
        name = info.name if len(info.name) <= 48 else info.name[:47] + "…"
        head.append(name, "italic")
        head.append("  ")
    head.append((e.sha or "?"), "dim")
    head.append("\n")
    if e.valid:
        head.append("valid", "bold green")
    elif e.corrupt:
        head.append("corrupt: ", "bold red")
        head.append_text(safe_cell(e.error, 200, "red"))
    else:
        head.append_text(safe_cell(e.error, 200, "bold yellow"))
    return head


def _titled(title: str, body: Text) -> Text:
    out = Text(title + "\n", style="bold underline")
    out.append_text(body)
    return out


class KvDetail(VerticalScroll):
    """Shows one `KvDetailInfo` (or a hint when nothing is selected)."""

    # Below this width the two columns stack and the hex dump shows 8 bytes a row.
    NARROW_BELOW = 110

    DEFAULT_CSS = """
    KvDetail {
        & #detail-status { padding: 0 1; background: $boost; }
        & Horizontal { height: auto; }
        &.-narrow Horizontal { layout: vertical; }
        & Vertical { width: 1fr; height: auto; padding: 0 1; }
        & Static { height: auto; margin-bottom: 1; }
        & #detail-preview { padding: 0 1; }
        & #detail-timeline { padding: 0 1; margin-bottom: 1; }
    }
    """

    def compose(self) -> ComposeResult:
        yield Static(Text("no file selected", style="dim"), id="detail-status", markup=False)
        yield Static("", id="detail-timeline", markup=False)
        # The decoded fields first: stacked on a narrow screen, they are what shows first.
        with Horizontal():
            with Vertical():
                yield Static("", id="detail-fields", markup=False)
                yield Static("", id="detail-score", markup=False)
                yield Static("", id="detail-cost", markup=False)
                yield Static("", id="detail-trailers", markup=False)
            with Vertical():
                yield Static("", id="detail-hex", markup=False)
                yield Static("", id="detail-payload", markup=False)
        yield Static("", id="detail-preview", markup=False)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._info: KvDetailInfo | None = None

    def on_resize(self, event) -> None:
        narrow = self.app.size.width < self.NARROW_BELOW
        if narrow != self.has_class("-narrow"):
            self.set_class(narrow, "-narrow")
            self.show(self._info)

    @property
    def hex_per_row(self) -> int:
        return 8 if self.has_class("-narrow") else 16

    @property
    def info(self) -> KvDetailInfo | None:
        """What the pane shows now (None: nothing selected)."""
        return self._info

    def show(self, info: KvDetailInfo | None) -> None:
        """Fill every section from `info`; None clears the pane."""
        self._info = info
        if info is None:
            self.query_one("#detail-status", Static).update(Text("no file selected", style="dim"))
            for sid in ("timeline", "hex", "payload", "fields", "score", "cost", "trailers", "preview"):
                self.query_one(f"#detail-{sid}", Static).update("")
            return
        self.query_one("#detail-status", Static).update(status_line(info))
        self.query_one("#detail-timeline", Static).update(timeline(info))
        self.query_one("#detail-hex", Static).update(_titled(
            f"Header ({len(info.raw_header)} of {PREFIX_BYTES} bytes)",
            Text("\n\n").join([hex_dump(info.raw_header, self.hex_per_row), hex_table(info.raw_header)])))
        self.query_one("#detail-payload", Static).update(_titled("DSV4 payload header", payload_section(info)))
        self.query_one("#detail-fields", Static).update(_titled("Decoded", decoded_section(info)))
        self.query_one("#detail-score", Static).update(_titled("Eviction score", score_section(info)))
        self.query_one("#detail-cost", Static).update(_titled("Resume", cost_section(info)))
        self.query_one("#detail-trailers", Static).update(_titled("Trailers", trailer_section(info)))
        preview = info.entry.text_preview
        body = file_text(preview) if preview else Text("—", style="dim")
        if info.entry.header and info.entry.header.text_bytes > len(preview.encode("utf-8", "replace")):
            body.append(" …", "dim")
        self.query_one("#detail-preview", Static).update(_titled("Text (start)", body))
