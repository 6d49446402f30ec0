"""What the cache browser reads from a directory in one pass, off the UI thread.

Owns: one `BrowserScan` (the store's scored entries with their checksums
checked once per file version (`ChecksumIndex`), plus each file's raw 52
header bytes for the hex view, the model fingerprint of ds4tui payloads, and
the verdict "another model" when that fingerprint is not the running
model's), and the `TextIndex` the filter searches (each file's text, re-read
only when the file changed). Pure Python, no Textual: the screen calls
`scan()` from a worker thread and shows the result.
Leaves to the cache core every decode and score (`KvStore.entries`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from ds4tui.cache.entry import NOT_LOADABLE, PREVIEW_BYTES, Acceptor, KvEntry, inspect_file
from ds4tui.format.kvc import PREFIX_BYTES, KvcFormatError, read_kvc
from ds4tui.cache.safe_open import open_regular
from ds4tui.cache.store import KvStore
from ds4tui.cache.prefixes import PrefixTree
from ds4tui.format.payload import DS4TUI_PAYLOAD_ABI, read_fingerprint

# Texts searched by the filter stay in memory; past this a file is searched by
# its first bytes only (a 30000-token prompt is ~120 KB of text).
FILTER_TEXT_CAP = 1 << 20


@dataclass
class BrowserScan:
    """One pass over the directory. `now` is the clock reading the scores used."""

    gen: int
    now: float
    entries: list[KvEntry]
    raw_headers: dict[str, bytes] = field(default_factory=dict)  # path -> first (up to) 52 bytes
    fingerprints: dict[str, bytes] = field(default_factory=dict)  # path -> 32-byte model fingerprint
    # Untitled files -> the chat they belong to (see `chat_of`).
    chats: dict[str, ChatOf] = field(default_factory=dict)
    # Files whose checksum, or text for the filter, this scan left unread (a first screen;
    # a second pass reads them).
    unchecked: int = 0


@dataclass(frozen=True)
class ChatOf:
    """Which titled session an untitled file belongs to: `sha`/`title` of that session, or
    `shared` > 1 when the file is the common start (e.g. the system prompt) of that many."""

    sha: str | None = None
    title: str | None = None
    shared: int = 0


class TextIndex:
    """The text of every file (its first FILTER_TEXT_CAP bytes), for names and the filter; a file
    is re-read only when its stat changes. Kept as bytes: decoded, and casefolded, only when a
    name or the filter first asks (a 10,000-file listing need not decode 150 MB of text)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # path -> [(inode, size, mtime_ns), bytes, decoded str or None, casefolded str or None]
        self._texts: dict[str, list] = {}

    def refresh(self, e: KvEntry, known: bytes | None = None) -> None:
        """Make sure `e`'s text is current; give a corrupt file (no preview from inspection) one.
        `known`: the text of the version `e.stat_key` names, when the header index had it."""
        key = e.stat_key
        if key is None or known is None:
            try:
                st = os.lstat(e.path)
            except OSError:
                return
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            cached = self._texts.get(e.path)
        if cached is None or cached[0] != key:
            raw = b""
            if known is not None:
                raw = known[:FILTER_TEXT_CAP]
            elif e.header is not None:
                try:
                    with open_regular(e.path) as fp:
                        fp.seek(PREFIX_BYTES)
                        raw = fp.read(min(e.header.text_bytes, FILTER_TEXT_CAP))
                except OSError:
                    pass
            cached = [key, raw, None, None]
            with self._lock:
                self._texts[e.path] = cached
        if not e.text_preview:
            e.text_preview = cached[1][:PREVIEW_BYTES * 4].decode("utf-8", "replace")[:PREVIEW_BYTES]

    def stale(self, e: KvEntry) -> bool:
        """Whether the text held for `e` is missing or of another version of the file."""
        with self._lock:
            cached = self._texts.get(e.path)
        return cached is None or e.stat_key is None or cached[0] != e.stat_key

    def raw(self, path: str) -> bytes | None:
        """The file's text bytes as last read (up to FILTER_TEXT_CAP), None when never read."""
        with self._lock:
            cached = self._texts.get(path)
        return cached[1] if cached else None

    def text(self, path: str) -> str | None:
        """The file's text as last read (up to FILTER_TEXT_CAP), decoded; None when never read."""
        with self._lock:
            cached = self._texts.get(path)
            if cached is None:
                return None
            if cached[2] is None:
                cached[2] = cached[1].decode("utf-8", "replace")
            return cached[2]

    def forget_except(self, paths: set[str]) -> None:
        with self._lock:
            for path in [p for p in self._texts if p not in paths]:
                del self._texts[path]

    def matches(self, e: KvEntry, needle: str) -> bool:
        """Case-insensitive substring of the title or the text; an empty needle matches all."""
        if not needle:
            return True
        needle = needle.casefold()
        if e.title is not None and needle in e.title.casefold():
            return True
        text = self.text(e.path)
        if text is None:
            return needle in (e.text_preview or "").casefold()
        with self._lock:
            cached = self._texts.get(e.path)
            if cached is not None and cached[3] is None:
                cached[3] = text.casefold()
            folded = cached[3] if cached is not None else text.casefold()
        return needle in folded


class ChecksumIndex:
    """Checksum verdicts; a file is read whole only when it is new or its inode or size changed
    (hits and pins rewrite header bytes in place, which the checksum does not cover). The
    verdicts also go to the header index (`persist_to`), so the next browser, in this process
    or another, does not read the same files whole again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verdicts: dict[str, tuple[tuple[int, int], str, str | None]] = {}  # path -> (key, verdict, error)
        self._new: dict[str, tuple[tuple[int, int], str, str | None]] = {}  # read since the last persist

    def load_from(self, index) -> None:
        """Take the verdicts the header index holds (for files not yet known here)."""
        stored = index.verdicts()
        with self._lock:
            for path, v in stored.items():
                self._verdicts.setdefault(path, v)

    def persist_to(self, index) -> None:
        with self._lock:
            new, self._new = self._new, {}
        if new:
            index.store_verdicts(new)

    def apply(self, e: KvEntry, *, read: bool = True) -> bool:
        """Fill e.checksum ("ok" / "mismatch"); a mismatch makes the entry corrupt with its reason.
        Without `read` only a verdict already known is applied. False when `e` still has an
        unchecked checksum."""
        if e.checksum != "unchecked":
            return True
        if e.stat_key is not None:
            key = (e.stat_key[0], e.stat_key[1])
        else:
            try:
                st = os.lstat(e.path)
            except OSError:
                return True
            key = (st.st_ino, st.st_size)
        with self._lock:
            cached = self._verdicts.get(e.path)
        if cached is None or cached[0] != key:
            if not read:
                return False
            checked = inspect_file(e.path, acceptor=None, verify=True, preview_bytes=0)
            if checked.checksum not in ("ok", "mismatch"):
                return True
            cached = (key, checked.checksum, checked.error if checked.checksum == "mismatch" else None)
            with self._lock:
                self._verdicts[e.path] = cached
                self._new[e.path] = cached
        e.checksum = cached[1]
        if cached[2]:
            e.error, e.corrupt, e.not_loadable = cached[2], True, None
        return True

    def forget_except(self, paths: set[str]) -> None:
        with self._lock:
            for path in [p for p in self._verdicts if p not in paths]:
                del self._verdicts[path]


def scan(store: KvStore, acceptor: Acceptor, *, gen: int, now: float, texts: TextIndex,
         model_fingerprint: bytes | None = None, checksums: ChecksumIndex | None = None,
         read_checksums: bool = True, all_texts: bool | None = None) -> BrowserScan:
    """Every file, scored, with its raw header bytes and fingerprint; `texts` (and `checksums`)
    are brought up to date. Without `read_checksums` only verdicts already known are applied
    (no file is read whole): `unchecked` then says how many are still to read. Without
    `all_texts` (default: as `read_checksums`) only the texts the names need are brought in
    (the rest, for the filter, come with the next pass): `unchecked` counts those too.
    The chat each untitled file belongs to comes from the store's relations (the header
    index keeps them), not from the texts."""
    if all_texts is None:
        all_texts = read_checksums
    result = BrowserScan(gen, now, store.entries(acceptor=acceptor))
    if checksums is not None:
        checksums.load_from(store.verdict_store())
    result.chats = {path: ChatOf(*c) for path, c in store.chats_of(result.entries).items()}
    wanted = []
    for e in result.entries:
        if checksums is not None and not checksums.apply(e, read=read_checksums):
            result.unchecked += 1
        rec = store.record(e.path)
        if rec is not None and rec.key == e.stat_key:  # the header index had this version
            _from_record(e, rec, result, model_fingerprint)
            if texts.stale(e):
                chat = result.chats.get(e.path)
                if all_texts or (e.title is None and not (chat and chat.sha)):
                    wanted.append(e)
                else:
                    result.unchecked += 1  # its text comes with the next pass
            continue
        _read_raw(e, result, model_fingerprint)
        texts.refresh(e)
    known = store.indexed_texts([e.path for e in wanted])
    for e in wanted:
        texts.refresh(e, known.get(e.path))
    paths = {e.path for e in result.entries}
    texts.forget_except(paths)
    if checksums is not None:
        checksums.forget_except(paths)
        checksums.persist_to(store.verdict_store())
    return result


def chat_of(entries: list[KvEntry], texts: TextIndex) -> dict[str, ChatOf]:
    """For each untitled file, the titled session (same model) it belongs to: the one whose
    text equals or extends it (the store's `held_by`), or the one it extends (a checkpoint
    written after the chat's last save). A file that starts several sessions (a shared
    system prompt) belongs to none of them: it is `shared` by them. The relations come
    from one sort of the texts (prefixes.PrefixTree)."""
    titled = [e for e in entries if e.header is not None and e.header.titled and e.sha and not e.corrupt]
    untitled = [e for e in entries if e.header is not None and not e.header.titled and not e.corrupt]
    if not titled or not untitled:
        return {}
    tree = PrefixTree({e.path: texts.raw(e.path) or None for e in titled + untitled})
    is_titled = {e.path: e for e in titled}
    out: dict[str, ChatOf] = {}
    for e in untitled:
        model = e.header.model_id
        mine = [is_titled[p] for p in tree.same(e.path) + tree.extensions(e.path)
                if p in is_titled and is_titled[p].header.model_id == model]
        if len(mine) > 1:
            out[e.path] = ChatOf(shared=len(mine))
            continue
        if mine:
            owner = mine[0]
        else:  # the longest session it extends
            extends = [is_titled[p] for p in tree.prefixes(e.path)
                       if p in is_titled and is_titled[p].header.model_id == model]
            if not extends:
                continue
            owner = max(extends, key=lambda t: t.header.text_bytes)
        out[e.path] = ChatOf(owner.sha, owner.title)
    return out


def _from_record(e: KvEntry, rec, result: BrowserScan, model_fingerprint: bytes | None) -> None:
    result.raw_headers[e.path] = rec.head
    if rec.fingerprint is not None:
        _fingerprint(e, rec.fingerprint, result, model_fingerprint)


def _read_raw(e: KvEntry, result: BrowserScan, model_fingerprint: bytes | None) -> None:
    try:
        if not e.regular:
            return
        with open_regular(e.path) as fp:
            result.raw_headers[e.path] = fp.read(PREFIX_BYTES)
            h = e.header
            if h is None or h.payload_abi != DS4TUI_PAYLOAD_ABI or not e.payload:
                return
            fingerprint = read_fingerprint(fp, PREFIX_BYTES + h.text_bytes, h.payload_bytes)
    except OSError:
        return
    if fingerprint is not None:
        _fingerprint(e, fingerprint, result, model_fingerprint)


def _fingerprint(e: KvEntry, fingerprint: bytes, result: BrowserScan, model_fingerprint: bytes | None) -> None:
    result.fingerprints[e.path] = fingerprint
    if model_fingerprint is not None and e.valid and fingerprint != model_fingerprint:
        # The header matched (same family id); the weights or config did not.
        # The engine would refuse it at load (payload.check_fingerprint); say so up front.
        e.not_loadable = f"written by another {e.model} model or config (fingerprint {fingerprint[:6].hex()}…)"
        e.error = NOT_LOADABLE + e.not_loadable


def read_transcript(e: KvEntry, cap: int) -> bytes:
    """The stored text of a file, at most `cap` bytes; a corrupt file gives what text it holds.

    Raises ValueError when the header does not decode, OSError when the file cannot be read."""
    if e.header is None:
        raise ValueError("the header does not decode")
    with open_regular(e.path) as fp:
        try:
            return read_kvc(fp).text[:cap]
        except KvcFormatError:
            fp.seek(PREFIX_BYTES)
            return fp.read(min(e.header.text_bytes, cap))
