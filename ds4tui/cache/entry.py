"""One `.kv` file, decoded for people: `KvEntry`, `inspect_file`, `Acceptor`.

Owns: turning a path into every decoded field plus a verdict (valid, corrupt,
or "not loadable here: <why>"), the `inspect --json` key set, what counts as
loadable by a given engine (`Acceptor`). File text shown to people goes through
`ds4tui.format.display`.
Leaves to the store (store.py and the modules it delegates to): the directory, eviction
and anything that writes.

Never raises for a bad file: the verdict is data. Two kinds of failure are
kept apart on purpose: a *corrupt* file (truncated, hash mismatch, token count
mismatch) may be deleted by the store; a file that is intact but *not loadable
here* (ds4's payload ABI, another model, a larger context) must be left alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ds4tui.format.kvc import (
    MAGIC,
    PREFIX_BYTES,
    VERSION,
    KvcFile,
    KvcFormatError,
    KvcHeader,
    check_lengths,
    decode_header,
    model_name,
    payload_abi_name,
    read_kvc,
    sha_from_name,
)
from ds4tui.cache.integrity import verify_file
from ds4tui.cache.policy import ScoreParts
from ds4tui.format.display import safe_text
from ds4tui.cache.safe_open import NotRegularFile, open_regular
from ds4tui.format.payload import DS4_PAYLOAD_ABI, DS4TUI_PAYLOAD_ABI, MODEL_ID_DSV4_CUSTOM, MODEL_ID_LLAMA, read_fingerprint

# Model ids ds4tui has an engine for; files with other ids are listed, never loaded.
DS4TUI_MODEL_IDS = frozenset({MODEL_ID_LLAMA, MODEL_ID_DSV4_CUSTOM})

# The stable `kv inspect --json` / `kv ls --json` keys (docs/format.md lists them; a test checks).
JSON_KEYS = (
    "sha", "path", "valid", "error", "magic", "version", "quant_bits", "reason",
    "reason_code", "ext_flags", "ext_flag_names", "model_id", "tokens", "hits",
    "ctx_size", "payload_abi", "created_at", "last_used", "payload_bytes",
    "text_bytes", "file_bytes", "title", "pinned", "text_preview", "payload", "trailers",
    "checksum",
)

NOT_LOADABLE = "not loadable here: "
PREVIEW_BYTES = 400

@dataclass(frozen=True)
class Acceptor:
    """What the running engine can load: files failing it are "not loadable here".

    `model_id=None` accepts any model ds4tui has an engine for (what `kv ls`
    uses); `ctx_size`/`quant_bits` None accept any. A file written for a
    smaller context loads into a larger one, never the reverse (as in ds4).
    """

    model_id: int | None = None
    payload_abi: int = DS4TUI_PAYLOAD_ABI
    ctx_size: int | None = None
    quant_bits: int | None = None
    # The running model's 32-byte payload fingerprint, when there is one: lets the
    # store recognize (and repair) its own files whose header a ds4 hit rewrote.
    fingerprint: bytes | None = None

    def why_not(self, h: KvcHeader) -> str | None:
        # ds4 before the ABI byte wrote 0 there (and a ds4 hit still rewrites it to 0): its layout
        if h.payload_abi != self.payload_abi and not (self.payload_abi == DS4_PAYLOAD_ABI and h.payload_abi == 0):
            return (f"payload ABI {h.payload_abi} ({payload_abi_name(h.payload_abi)}),"
                    f" this engine loads ABI {self.payload_abi} ({payload_abi_name(self.payload_abi)})")
        if self.model_id is None:
            if h.model_id not in DS4TUI_MODEL_IDS:
                return f"model {model_name(h.model_id)} has no ds4tui engine"
        elif h.model_id != self.model_id:
            return f"written by {model_name(h.model_id)}, this engine is {model_name(self.model_id)}"
        if self.quant_bits is not None and h.quant != self.quant_bits:
            # Same model id, other bits: another model of the family (or another quantization).
            return f"other weights: quant bits {h.quant}, this model's are {self.quant_bits}"
        if self.ctx_size is not None and h.ctx_size > self.ctx_size:
            return f"written for context {h.ctx_size}, this session has {self.ctx_size}"
        return None


ANY_DS4TUI = Acceptor()


@dataclass
class KvEntry:
    """Everything known about one file. `header` is None when it did not decode."""

    path: str
    sha: str | None
    file_bytes: int
    header: KvcHeader | None = None
    magic: str = ""
    error: str | None = None
    corrupt: bool = False
    not_loadable: str | None = None
    title: str | None = None
    title_bytes: bytes | None = None
    text_preview: str = ""
    payload: dict | None = None
    trailers: dict = field(default_factory=dict)
    score: ScoreParts | None = None
    # Set by the store: text is a strict prefix of a newer file's text, or of a titled
    # session's (`held_by` names that session; `duplicate` when the texts are equal).
    superseded: bool = False
    held_by: str | None = None
    duplicate: bool = False
    deep: bool = False
    # "ok", "mismatch", "none" (no checksum trailer: ds4's files, older ds4tui
    # files), "unchecked" (has one, not verified by this inspection) or "" (not read).
    checksum: str = ""
    # False for a FIFO, device, directory or symlink under a cache-file name:
    # never opened, never written, never evicted, counted as 0 bytes.
    regular: bool = True
    # (inode, size, mtime_ns) of the version read: a destructive step acts only on that one.
    stat_key: tuple[int, int, int] | None = None

    @property
    def valid(self) -> bool:
        return self.error is None

    @property
    def pinned(self) -> bool:
        return bool(self.header and self.header.pinned)

    @property
    def model(self) -> str:
        return model_name(self.header.model_id) if self.header else "?"

    def to_json(self) -> dict:
        h = self.header
        out = {
            "sha": self.sha, "path": self.path, "valid": self.valid, "error": self.error,
            "magic": self.magic,
            "version": h.version if h else None,
            "quant_bits": h.quant_bits if h else None,
            "reason": h.reason if h else None,
            "reason_code": h.reason_code if h else None,
            "ext_flags": h.ext_flags if h else None,
            "ext_flag_names": h.ext_flag_names if h else [],
            "model_id": h.model_id if h else None,
            "tokens": h.tokens if h else None,
            "hits": h.hits if h else None,
            "ctx_size": h.ctx_size if h else None,
            "payload_abi": h.payload_abi if h else None,
            "created_at": h.created_at if h else None,
            "last_used": h.last_used if h else None,
            "payload_bytes": h.payload_bytes if h else None,
            "text_bytes": h.text_bytes if h else None,
            "file_bytes": self.file_bytes,
            "title": self.title,
            "pinned": self.pinned,
            "text_preview": self.text_preview,
            "payload": self.payload,
            "trailers": self.trailers,
            "checksum": self.checksum or None,
        }
        assert tuple(out) == JSON_KEYS
        return out


def _fail(entry: KvEntry, reason: str, *, corrupt: bool) -> KvEntry:
    entry.error = reason
    entry.corrupt = corrupt
    return entry


def _judge(entry: KvEntry, acceptor: Acceptor | None) -> KvEntry:
    """Header-level verdict shared by the quick and the deep inspection."""
    h = entry.header
    if h.tokens == 0:
        return _fail(entry, "header says 0 tokens", corrupt=True)
    try:
        check_lengths(h, entry.file_bytes)
    except KvcFormatError as exc:
        return _fail(entry, str(exc), corrupt=True)
    if acceptor is not None:
        why = acceptor.why_not(h)
        if why:
            entry.not_loadable = why
            return _fail(entry, NOT_LOADABLE + why, corrupt=False)
    return entry


def inspect_file(path: str | os.PathLike, *, acceptor: Acceptor | None = ANY_DS4TUI,
                 deep: bool = True, preview_bytes: int = PREVIEW_BYTES, verify: bool = False,
                 keep: dict | None = None) -> KvEntry:
    """Decode one file. `deep` also reads the text (hash check), the payload's
    DSV4 header (token count check) and the trailers; without it only the 52
    header bytes are read, which is what eviction and lookup need. `verify`
    (with `deep`) reads the whole file to check its checksum. `keep` (a dict) receives
    what the header index stores beside the entry: "head" (the raw header bytes), "text",
    "fingerprint" (a ds4tui payload's model fingerprint)."""
    path = Path(path)
    entry = KvEntry(path=str(path), sha=sha_from_name(path.name), file_bytes=0, deep=deep)
    try:
        with open_regular(path) as fp:
            st = os.fstat(fp.fileno())
            entry.file_bytes = st.st_size
            entry.stat_key = (st.st_ino, st.st_size, st.st_mtime_ns)
            failed = _read_header(entry, fp, keep)
            if failed is not None:
                return failed
            if not deep:
                return _judge(entry, acceptor)
            return _inspect_deep(entry, fp, acceptor, preview_bytes, verify, keep)
    except FileNotFoundError:
        return _fail(entry, "file not found", corrupt=False)
    except NotRegularFile as exc:
        entry.regular = False
        return _fail(entry, str(exc), corrupt=False)
    except OSError as exc:
        return _fail(entry, f"cannot read: {exc.strerror or exc}", corrupt=False)


def is_foreign_version(head: bytes) -> bool:
    """A KVC file of a later version is someone else's format, not damage."""
    return len(head) >= 4 and head[:3] == MAGIC and head[3] != VERSION


def _header_failed(entry: KvEntry, head: bytes, exc: KvcFormatError) -> KvEntry:
    if is_foreign_version(head):
        entry.not_loadable = str(exc)
        return _fail(entry, NOT_LOADABLE + str(exc), corrupt=False)
    return _fail(entry, str(exc), corrupt=True)


def _read_header(entry: KvEntry, fp, keep: dict | None = None) -> KvEntry | None:
    """Fill entry.magic and entry.header from the first 52 bytes; the failed entry if they do not decode."""
    head = fp.read(PREFIX_BYTES)
    if keep is not None:
        keep["head"] = head
    entry.magic = safe_text(head[:3])
    try:
        entry.header = decode_header(head)
    except KvcFormatError as exc:
        return _header_failed(entry, head, exc)
    return None


def _inspect_deep(entry: KvEntry, fp, acceptor: Acceptor | None, preview_bytes: int, verify: bool,
                  keep: dict | None = None) -> KvEntry:
    try:
        kf = read_kvc(fp)
    except KvcFormatError as exc:
        return _fail(entry, str(exc), corrupt=True)
    if keep is not None:
        keep["text"] = kf.text
        if kf.header.payload_abi == DS4TUI_PAYLOAD_ABI and kf.payload_header is not None:
            keep["fingerprint"] = read_fingerprint(fp, kf.payload_offset, kf.header.payload_bytes)
    _fill_from_file(entry, kf, preview_bytes)
    entry.checksum = "none" if kf.checksum is None else "unchecked"
    if verify and kf.checksum is not None:
        verdict = verify_file(fp, kf)
        entry.checksum = "ok" if verdict == "ok" else "mismatch"
        if verdict != "ok":
            return _fail(entry, verdict, corrupt=True)
    if entry.sha is None:
        entry.sha = kf.identity_sha
    elif kf.identity_sha != entry.sha:
        what = "title identity" if kf.header.titled else "stored text hash"
        return _fail(entry, f"{what} {kf.identity_sha[:12]} does not match the file name", corrupt=True)
    ph = kf.payload_header
    if ph is not None and ph.token_count != kf.header.tokens:
        return _fail(entry, f"payload token count {ph.token_count} != header tokens {kf.header.tokens}", corrupt=True)
    return _judge(entry, acceptor)


def _fill_from_file(entry: KvEntry, kf: KvcFile, preview_bytes: int) -> None:
    entry.title_bytes = kf.title_bytes
    entry.title = kf.title
    entry.text_preview = kf.text[:preview_bytes].decode("utf-8", errors="replace")
    entry.payload = kf.payload_header.as_dict() if kf.payload_header else None
    tool_map = None
    if kf.tool_map is not None:
        tool_map = {
            "count": len(kf.tool_map),
            "ids": [e.tool_id.decode("utf-8", errors="replace") for e in kf.tool_map],
            "dsml_bytes": sum(len(e.dsml) for e in kf.tool_map),
        }
    entry.trailers = {
        "tool_map": tool_map,
        "title_bytes": len(kf.title_bytes) if kf.title_bytes is not None else None,
        "trailer_bytes": kf.trailer_bytes,
        "extra_bytes": kf.extra_bytes,
    }


# The fields of an acceptor-free deep inspection that the header index stores (index.py):
# the ones every listing reads, and the "extra" ones (a preview, the payload and trailer
# summaries) that only a detail view or `--json` reads, decoded when first asked for.
_RECORD_FIELDS = ("sha", "file_bytes", "magic", "error", "corrupt", "not_loadable", "title",
                  "checksum", "stat_key")
_EXTRA_FIELDS = ("text_preview", "payload", "trailers")


def entry_record(e: KvEntry) -> tuple[dict, dict]:
    """`e` (inspected with acceptor=None, deep) as the header index stores it: (core, extra)."""
    core = {f: getattr(e, f) for f in _RECORD_FIELDS}
    core["title_bytes"] = e.title_bytes.hex() if e.title_bytes is not None else None
    return core, {f: getattr(e, f) for f in _EXTRA_FIELDS}


class IndexedEntry(KvEntry):
    """A KvEntry built from the header index: the extra fields stay JSON text until read."""

    _extra_json: str | None = None

    def _extra(self) -> dict:
        raw = self.__dict__.pop("_extra_json", None)
        if callable(raw):  # fetched from the index when first read (the lookup's entries)
            raw = raw() or "{}"
        if raw is not None:
            try:
                extra = json.loads(raw)
            except ValueError:
                extra = {}
            if not isinstance(extra, dict):
                extra = {}
            self.__dict__["_text_preview"] = str(extra.get("text_preview") or "")
            payload = extra.get("payload")
            self.__dict__["_payload"] = payload if isinstance(payload, dict) else None
            trailers = extra.get("trailers")
            self.__dict__["_trailers"] = trailers if isinstance(trailers, dict) else {}
        return self.__dict__


def _lazy(name: str):
    def get(self):
        return self._extra().get("_" + name)

    def put(self, value):
        self._extra()  # a value set wins over the stored one
        self.__dict__["_" + name] = value
    return property(get, put)


for _name in _EXTRA_FIELDS:
    setattr(IndexedEntry, _name, _lazy(_name))
_DEFAULTS = {k: v for k, v in KvEntry(path="", sha=None, file_bytes=0, deep=True).__dict__.items()
             if k not in _EXTRA_FIELDS and k != "trailers"}


def entry_from_record(path: str, head: bytes, record: dict, acceptor: Acceptor | None,
                      extra=None) -> KvEntry | None:
    """The entry `inspect_file(path, acceptor=acceptor)` would give for the indexed version
    (`extra`: the JSON of its extra fields, or a function returning it, decoded when first
    read); None when the record
    is not one this code wrote (the file is then read instead)."""
    try:
        # Built without __init__ (10,000 of these per listing): the defaults, then the record.
        e = IndexedEntry.__new__(IndexedEntry)
        d = e.__dict__
        d.update(_DEFAULTS)
        d["trailers"] = {}
        d.update(path=path, sha=record["sha"], file_bytes=int(record["file_bytes"]))
        for f in _RECORD_FIELDS[2:]:
            d[f] = record[f]
        d["stat_key"] = tuple(record["stat_key"]) if record["stat_key"] else None
        tb = record.get("title_bytes")
        d["title_bytes"] = bytes.fromhex(tb) if tb is not None else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    for f in _EXTRA_FIELDS:
        d.pop(f, None)
    d["_extra_json"] = extra if extra is not None else "{}"
    try:
        e.header = decode_header(head)
    except KvcFormatError:
        e.header = None
    if e.header is None and e.error is None:
        return None  # claims a valid file whose header does not decode
    if e.valid and e.header is not None and acceptor is not None:
        why = acceptor.why_not(e.header)
        if why:
            e.not_loadable = why
            _fail(e, NOT_LOADABLE + why, corrupt=False)
    return e
