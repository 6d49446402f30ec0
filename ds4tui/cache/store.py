"""The disk cache directory: scan, lookup, load, save, touch, pin, delete, evict.

Owns: the file operations on one directory of `<sha1>.kv` files, the load
validation chain (README, "KVC file format" > "Loading, saving, evicting"),
atomic saves within the budget, and eviction.
Leaves to callers: the payload (opaque, streamed through `write_payload(fp)` /
`load_payload(fp, nbytes)` callbacks), when to save (policy.py helps) and how
to show the returned events.

Rules that keep a shared directory consistent, even with another process (or
ds4 itself) saving and evicting in it at the same time:
- only `<40 hex>.kv` names are cache files; `*.tmp.*` and the rest are ignored;
- a save writes `<sha>.kv.tmp.<pid>.<rand>`, fsyncs it and renames it into place,
  so a reader sees either no file or a whole one;
- a file may vanish between scan and open: FileNotFoundError is a skip, not damage;
- only a file proven corrupt (truncated, hash or token-count mismatch) is
  deleted, and only if the name still points at the file that was read;
  a file that is intact but not loadable here (ds4's ABI, another model) is left alone;
- in-place writes touch only hits/last_used (on a hit) and ext_flags bit 7 (pin).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ds4tui.cache import eviction, files
from ds4tui.cache.files import WritePayload
from ds4tui.cache.entry import ANY_DS4TUI, NOT_LOADABLE, Acceptor, KvEntry, inspect_file, is_foreign_version
from ds4tui.cache.events import Evicted, EvictedFile, Hit, Miss, Rejected, Saved, SaveFailed
from ds4tui.cache.integrity import ChecksumMismatch, VerifyingReader, covered_tail, new_hasher
from ds4tui.format.kvc import (
    CHECKSUM_TRAILER_BYTES,
    EXT_CHECKSUM,
    EXT_PINNED,
    EXT_SESSION_TITLE,
    EXT_TOOL_MAP,
    EXT_TRAILERS,
    OFFSET_EXT_FLAGS,
    PREFIX_BYTES,
    QUANT_DS4TUI_MARK,
    KvcFile,
    KvcFormatError,
    KvcHeader,
    decode_header,
    kv_name,
    read_kvc,
    reason_code,
    sha_from_name,
    text_sha,
    title_sha,
    trailer_bytes,
)
from ds4tui.cache.policy import DEFAULT_POLICY, MIB, CachePolicy
from ds4tui.format.display import human_bytes
from ds4tui.cache.safe_open import CacheDirError, NotRegularFile, dir_problem, open_regular

# Returns the number of tokens it restored, or None when it cannot tell.
LoadPayload = Callable[[BinaryIO, int], int | None]


@dataclass(frozen=True)
class LoadResult:
    """`event` is the Hit or the Miss; `events` every step (rejections first)."""

    event: Hit | Miss
    events: tuple
    tool_map: tuple | None = None

    @property
    def hit(self) -> Hit | None:
        return self.event if isinstance(self.event, Hit) else None


@dataclass(frozen=True)
class SaveResult:
    """`event` is the Saved or the SaveFailed; `events` adds any eviction."""

    event: Saved | SaveFailed
    events: tuple

    @property
    def ok(self) -> bool:
        return isinstance(self.event, Saved)


class _Reject(Exception):
    def __init__(self, reason: str, corrupt: bool):
        super().__init__(reason)
        self.reason, self.corrupt = reason, corrupt


def _titled(fp: BinaryIO) -> bool:
    """Whether the open file's ext_flags carry the session-title bit (False when unreadable)."""
    try:
        fp.seek(OFFSET_EXT_FLAGS)
        flags = fp.read(1)
    except OSError:
        return False
    return bool(flags) and bool(flags[0] & EXT_SESSION_TITLE)


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class KvStore:
    """One cache directory under a byte budget (default 4096 MiB)."""

    def __init__(self, directory: str | os.PathLike, policy: CachePolicy = DEFAULT_POLICY, *,
                 budget_mb: float | None = None, clock: Callable[[], float] = time.time):
        self.dir = Path(directory)
        self.policy = policy
        self.budget_bytes = int((budget_mb if budget_mb is not None else policy.budget_mb) * MIB)
        self._clock = clock
        self._text_shas: dict[str, tuple[tuple[int, int, int], str | None]] = {}  # name -> (stat key, sha)
        # The lookup's view of each file: name -> ((inode, size, mtime_ns), acceptor, entry).
        self._headers: dict[str, tuple[tuple[int, int, int], Acceptor, KvEntry]] = {}

    # -- reading -------------------------------------------------------------

    def path_for(self, sha: str) -> Path:
        return self.dir / kv_name(sha)

    def problem(self, *, write: bool = True) -> str | None:
        """Why this directory cannot be used (not a directory, unreadable, read-only), or None."""
        return dir_problem(self.dir, write=write)

    def shas(self) -> list[str]:
        """SHA of every cache file name in the directory (none if it does not exist).

        Raises CacheDirError, with a one-line reason, when the path is not a
        readable directory."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CacheDirError(exc.errno, self.problem(write=False)
                                or f"cache directory {self.dir}: {exc.strerror or exc}") from None
        return sorted(s for s in map(sha_from_name, names) if s)

    def find(self, prefix: str) -> list[str]:
        prefix = prefix.lower()
        return [s for s in self.shas() if s.startswith(prefix)]

    def scan(self, *, deep: bool = False, acceptor: Acceptor | None = None, verify: bool = False) -> list[KvEntry]:
        """Every cache file, decoded (`verify`: checksums checked too). Files that vanish mid-scan are skipped."""
        entries = []
        shas = self.shas()
        files.remove_stale_tmp(self.dir, self.policy.stale_tmp_s)  # crashed writers' leftovers, at once
        for sha in shas:
            e = inspect_file(self.path_for(sha), acceptor=acceptor, deep=deep, verify=verify)
            if self._repaired(e, acceptor):
                e = inspect_file(self.path_for(sha), acceptor=acceptor, deep=deep, verify=verify)
            if e.error != "file not found":
                entries.append(e)
        return entries

    @staticmethod
    def _repaired(e: KvEntry, acceptor: Acceptor | None) -> bool:
        """Repair one of this model's files whose header bytes 7/20 a ds4 hit zeroed (see
        files.repair_zeroed_header); only an acceptor that knows its model's fingerprint can."""
        h = e.header
        if acceptor is None or acceptor.fingerprint is None or acceptor.model_id is None or h is None:
            return False
        if h.model_id != 0 or h.payload_abi != 0 or not e.not_loadable:
            return False
        return files.repair_zeroed_header(Path(e.path), model_id=acceptor.model_id,
                                          payload_abi=acceptor.payload_abi, fingerprint=acceptor.fingerprint)

    def entries(self, acceptor: Acceptor | None = ANY_DS4TUI, *, verify: bool = False) -> list[KvEntry]:
        """Every file fully inspected and scored: what `kv ls` and the cache browser show."""
        return self.score(self.scan(deep=True, acceptor=acceptor, verify=verify))

    def score(self, entries: list[KvEntry], incoming: eviction.Incoming | None = None) -> list[KvEntry]:
        """Fill in `superseded` and `score` (reads the texts of possible superseders)."""
        eviction.mark_superseded(entries, self._text_of, incoming)
        eviction.score_entries(entries, self.policy, self._clock())
        return entries

    def _text_of(self, e: KvEntry) -> bytes | None:
        return files.read_text(e.path, e.header.text_bytes)

    def _text_sha(self, e: KvEntry) -> str | None:
        """SHA-1 of a file's stored text, memoized per file version (the stat key the
        lookup's listing already took): the index of titled sessions by what they hold."""
        name = Path(e.path).name
        listed = self._headers.get(name)
        if listed is None:
            return None
        key = listed[0]
        memo = self._text_shas.get(name)
        if memo is not None and memo[0] == key:
            return memo[1]
        text = self._text_of(e)
        sha = hashlib.sha1(text).hexdigest() if text is not None else None
        self._text_shas[name] = (key, sha)
        return sha

    def lookup(self, prompt: str | bytes, acceptor: Acceptor) -> list[KvEntry]:
        """Candidates whose text is a byte prefix of `prompt`, longest first.

        An anonymous file is named by the SHA-1 of its text; a titled session by its
        title, so its text hash comes from `_text_sha` (read once per file version).
        That way a chat's titled file is also the disk hit for any prompt extending
        it, and quitting need not write an anonymous copy of the same state.
        Files the acceptor refuses are skipped.
        """
        prompt = _as_bytes(prompt)
        entries = [e for e in self._lookup_entries(acceptor)
                   if e.valid and e.header.text_bytes <= len(prompt)]
        # One incremental SHA-1 over the prompt, shortest candidate first.
        entries.sort(key=lambda e: e.header.text_bytes)
        h, fed, found = hashlib.sha1(), 0, []
        for e in entries:
            n = e.header.text_bytes
            h.update(prompt[fed:n])
            fed = n
            if h.copy().hexdigest() == (self._text_sha(e) if e.header.titled else e.sha):
                found.append(e)
        found.sort(key=lambda e: (e.header.text_bytes, e.header.tokens), reverse=True)
        return found

    def _lookup_entries(self, acceptor: Acceptor) -> list[KvEntry]:
        """What `scan(acceptor=...)` returns, re-reading a file's header only when its inode,
        size or mtime changed since the last lookup: one stat per file per message instead
        of an open and a read (a lookup in 300 files: 6.3 ms -> ~1 ms, docs/perf.md).

        A header written in place within the filesystem's timestamp tick may go unseen until
        the next change; the load re-reads and checks the header of the file it picks, so a
        stale view can cost a hit, never load a wrong file."""
        try:
            with os.scandir(self.dir) as it:
                found = {}
                for d in it:
                    if sha_from_name(d.name):
                        try:
                            st = d.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        found[d.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            found = {}
        except OSError as exc:
            raise CacheDirError(exc.errno, self.problem(write=False)
                                or f"cache directory {self.dir}: {exc.strerror or exc}") from None
        files.remove_stale_tmp(self.dir, self.policy.stale_tmp_s)
        memo, self._headers = self._headers, {}
        entries = []
        for name in sorted(found):
            key = found[name]
            old = memo.get(name)
            if old is not None and old[0] == key and old[1] == acceptor:
                e = old[2]
            else:
                path = self.dir / name
                e = inspect_file(path, acceptor=acceptor, deep=False)
                if self._repaired(e, acceptor):
                    e = inspect_file(path, acceptor=acceptor, deep=False)
                    try:
                        st = os.stat(path, follow_symlinks=False)
                        key = (st.st_ino, st.st_size, st.st_mtime_ns)
                    except OSError:
                        continue
            if e.error == "file not found":
                continue
            self._headers[name] = (key, acceptor, e)
            entries.append(e)
        for gone in self._text_shas.keys() - self._headers.keys():
            del self._text_shas[gone]
        return entries

    # -- loading -------------------------------------------------------------

    def load(self, prompt: str | bytes, acceptor: Acceptor, load_payload: LoadPayload) -> LoadResult:
        """Restore the longest cached prefix of `prompt`; try shorter ones if it is rejected."""
        prompt = _as_bytes(prompt)
        events: list = []
        try:
            candidates = self.lookup(prompt, acceptor)
        except CacheDirError as exc:
            miss = Miss(str(exc))
            return LoadResult(miss, (miss,))
        for e in candidates:
            result = self._load_path(Path(e.path), e.sha, prompt, acceptor, load_payload, events)
            if result is not None:
                return result
        if not candidates:
            miss = Miss("no cached prefix of this prompt")
        else:
            miss = Miss(f"{len(candidates)} candidate(s) rejected")
        return LoadResult(miss, tuple(events) + (miss,))

    def load_file(self, sha: str, acceptor: Acceptor, load_payload: LoadPayload,
                  prompt: str | bytes | None = None) -> LoadResult:
        """Restore one named file (a titled session); with `prompt`, its text must prefix it."""
        events: list = []
        result = self._load_path(self.path_for(sha), sha, None if prompt is None else _as_bytes(prompt),
                                 acceptor, load_payload, events)
        if result is not None:
            return result
        miss = Miss(events[-1].reason if events else "file not found")
        return LoadResult(miss, tuple(events) + (miss,))

    def _load_path(self, path: Path, sha: str, prompt: bytes | None, acceptor: Acceptor,
                   load_payload: LoadPayload, events: list) -> LoadResult | None:
        t0 = time.perf_counter()
        try:
            fp = open_regular(path)
        except FileNotFoundError:
            return None  # evicted by someone else since the scan
        except OSError as exc:  # a FIFO, directory or link under this name; unreadable
            events.append(Rejected(sha, str(exc) if isinstance(exc, NotRegularFile)
                                   else f"cannot read: {exc.strerror or exc}", False))
            return None
        with fp:
            try:
                kf = self._validate(fp, sha, prompt, acceptor, load_payload)
            except _Reject as rej:
                # A titled session is someone's conversation: even corrupt, it stays (listed
                # with its reason) until they delete it. Untitled checkpoints are only a cache.
                deleted = rej.corrupt and not _titled(fp) and files.unlink_if_same(path, fp)
                events.append(Rejected(sha, rej.reason, deleted))
                return None
        h = kf.header
        files.write_header_fields(path, hits=h.hits + 1, last_used=int(self._clock()))
        hit = Hit(sha=sha, path=str(path), reason=h.reason, tokens=h.tokens, text_bytes=h.text_bytes,
                  bytes=kf.file_bytes, hits=h.hits + 1, ms=_ms(t0), title=kf.title)
        return LoadResult(hit, tuple(events) + (hit,), kf.tool_map)

    def _validate(self, fp: BinaryIO, sha: str, prompt: bytes | None, acceptor: Acceptor,
                  load_payload: LoadPayload) -> KvcFile:
        """The README's load checks, in order: magic and ABI -> model -> name hash -> byte prefix
        -> payload token count. The acceptor runs before anything that could
        call a file corrupt, so a foreign file is never deleted."""
        head = fp.read(PREFIX_BYTES)
        try:
            header = decode_header(head)
        except KvcFormatError as exc:
            foreign = is_foreign_version(head)
            raise _Reject(NOT_LOADABLE + str(exc) if foreign else str(exc), corrupt=not foreign) from None
        why = acceptor.why_not(header)
        if why:
            raise _Reject(NOT_LOADABLE + why, corrupt=False)
        if header.tokens == 0:
            raise _Reject("header says 0 tokens", corrupt=True)
        try:
            kf = read_kvc(fp)
        except KvcFormatError as exc:
            raise _Reject(str(exc), corrupt=True) from None
        if kf.identity_sha != sha:
            what = "title identity" if header.titled else "stored text hash"
            raise _Reject(f"{what} does not match the file name", corrupt=True)
        if prompt is not None and not prompt.startswith(kf.text):
            raise _Reject("cached text is not a byte prefix of the prompt", corrupt=False)
        ph = kf.payload_header
        if ph is not None and ph.token_count != header.tokens:
            raise _Reject(f"payload token count {ph.token_count} != header tokens {header.tokens}", corrupt=True)
        try:
            stream = self._payload_stream(fp, kf)
            restored = load_payload(stream, header.payload_bytes)
            if isinstance(stream, VerifyingReader) and not stream.verified:
                stream.drain()  # the engine stopped short: the digest is still checked
        except ChecksumMismatch as exc:
            raise _Reject(str(exc), corrupt=True) from None
        except Exception as exc:  # the engine's own error: report it, keep the file
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ChecksumMismatch):
                raise _Reject(str(cause), corrupt=True) from None
            raise _Reject(f"payload load failed: {exc}", corrupt=False) from None
        if isinstance(restored, int) and restored != header.tokens:
            raise _Reject(f"payload restored {restored} tokens, header says {header.tokens}", corrupt=True)
        return kf

    @staticmethod
    def _payload_stream(fp: BinaryIO, kf: KvcFile) -> BinaryIO | VerifyingReader:
        """The payload of `kf`, positioned at its start; through the checksum when the file has one
        (ChecksumMismatch is raised by the read that completes the payload)."""
        if kf.checksum is None:
            fp.seek(kf.payload_offset)
            return fp
        hasher = new_hasher()
        hasher.update(kf.text)
        tail = covered_tail(fp, kf)
        fp.seek(kf.payload_offset)
        return VerifyingReader(fp, hasher, kf.header.payload_bytes, tail, kf.checksum)

    # -- in-place writes ------------------------------------------------------

    def touch(self, sha: str) -> bool:
        """Count a hit: hits+1 and last_used=now, in place."""
        e = inspect_file(self.path_for(sha), acceptor=None, deep=False)
        if e.header is None:
            return False
        return files.write_header_fields(self.path_for(sha), hits=e.header.hits + 1, last_used=int(self._clock()))

    def set_pinned(self, sha: str, pinned: bool) -> bool:
        """Pin (never evicted) or unpin: ext_flags bit 7, in place."""
        if pinned:
            return files.write_header_fields(self.path_for(sha), ext_flags=lambda f: f | EXT_PINNED)
        return files.write_header_fields(self.path_for(sha), ext_flags=lambda f: f & ~EXT_PINNED)

    def delete(self, sha: str) -> bool:
        """Remove one name (a symlink itself, never its target); False when already gone.

        Raises OSError for what cannot be removed (a directory under that name, a read-only directory)."""
        path = self.path_for(sha)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                raise IsADirectoryError(21, "is a directory, not a cache file", str(path))
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def rename_title(self, sha: str, title: str | bytes) -> str:
        """Retitle a titled session; returns its new SHA, SHA-1(new title || created_at).

        A titled file's name is derived from its title, so renaming writes a
        copy under the new name (tmp + atomic rename, like a save; header,
        text, payload and tool map unchanged, the title trailer replaced) and
        only then removes the old file: at every moment at least one whole
        copy exists. The copy is transient, so the budget is not consulted.
        Raises ValueError (not titled, undecodable, new name taken) or OSError.
        """
        title_b = _as_bytes(title)
        if not title_b:
            raise ValueError("a title cannot be empty")
        with open_regular(self.path_for(sha)) as fp:
            try:
                kf = read_kvc(fp)
            except KvcFormatError as exc:
                raise ValueError(f"{sha[:12]}: {exc}") from None
            if not kf.header.titled:
                raise ValueError(f"{sha[:12]} is not a titled session")
            new_sha = title_sha(title_b, kf.header.created_at)
            if new_sha == sha:
                return sha
            if os.path.lexists(self.path_for(new_sha)):
                raise ValueError(f"a session with that title and creation time exists ({new_sha[:12]})")

            source = self._payload_stream(fp, kf)  # a corrupt source must not get a fresh checksum

            def copy_payload(out: BinaryIO) -> None:
                left = kf.header.payload_bytes
                while left:
                    chunk = source.read(min(left, 1 << 20))
                    if not chunk:
                        raise OSError(f"{sha[:12]} shrank while it was copied")
                    out.write(chunk)
                    left -= len(chunk)

            # The copy is written as every ds4tui file now is: checksummed and marked for ds4.
            header = kf.header.with_(ext_flags=kf.header.ext_flags | EXT_CHECKSUM,
                                     quant_bits=kf.header.quant_bits | QUANT_DS4TUI_MARK)
            try:
                files.write_atomic(self.path_for(new_sha), header, kf.text, copy_payload,
                                   trailer_bytes(kf.tool_map, title_b))
            except ChecksumMismatch as exc:
                raise ValueError(f"{sha[:12]}: {exc}") from None
        self.delete(sha)
        return new_sha

    # -- saving --------------------------------------------------------------

    def save(self, text: str | bytes, *, tokens: int, reason: str, engine: Acceptor,
             payload_bytes: int, write_payload: WritePayload, title: str | bytes | None = None,
             created_at: int | None = None, tool_map=None, ext_flags: int = 0,
             pinned: bool = False, fresh: bool = False) -> SaveResult:
        """Write a checkpoint of `tokens` tokens whose rendered text is `text`.

        `engine` names the writer (model_id, payload_abi, ctx_size, quant_bits).
        `write_payload(fp)` must write exactly `payload_bytes`. A titled session
        is named SHA-1(title || created_at): pass the same `created_at` to
        re-save it under the same name. `fresh` (a titled session's first save,
        or one under a new title): never replace an existing file; when the name
        is taken (another session with the same title created in the same second,
        in this process or another) created_at is bumped by a second until the
        name is free, and the Saved event carries the created_at used. Never
        raises for I/O or callback failures: they come back as a SaveFailed and
        leave no trace on disk.
        """
        if engine.model_id is None or engine.ctx_size is None:
            raise ValueError("save needs engine.model_id and engine.ctx_size")
        text = _as_bytes(text)
        title_b = None if title is None else _as_bytes(title)
        now = int(self._clock())
        created = now if created_at is None else created_at
        sha = text_sha(text) if title_b is None else title_sha(title_b, created)
        tail = trailer_bytes(tool_map, title_b)
        flags = (ext_flags & ~(EXT_TRAILERS | EXT_PINNED)) | EXT_CHECKSUM
        flags |= (EXT_TOOL_MAP if tool_map is not None else 0) | (EXT_SESSION_TITLE if title_b is not None else 0)
        flags |= EXT_PINNED if pinned else 0
        header = KvcHeader(quant_bits=(engine.quant_bits or 0) | QUANT_DS4TUI_MARK, reason_code=reason_code(reason),
                           ext_flags=flags, model_id=engine.model_id, tokens=tokens, hits=0,
                           ctx_size=engine.ctx_size, payload_abi=engine.payload_abi,
                           created_at=created, last_used=now, payload_bytes=payload_bytes,
                           text_bytes=len(text))
        file_bytes = header.body_bytes + len(tail) + CHECKSUM_TRAILER_BYTES

        def failed(why: str, *extra) -> SaveResult:
            ev = SaveFailed(why, tokens, file_bytes)
            return SaveResult(ev, (*extra, ev))

        reused = self._reusable(sha, header, text, engine)
        if reused is not None:
            return SaveResult(reused, (reused,))
        required = self.policy.required_bytes(file_bytes)
        try:
            entries = self.scan()
        except CacheDirError as exc:
            return failed(str(exc))
        previous = next((e for e in entries if e.sha == sha and e.header is not None), None)
        if previous is not None:
            # Re-saving a session (the same name) keeps what belongs to the file, not to
            # this state: its pin, and its hit counter (each resume counted one).
            header = header.with_(hits=previous.header.hits)
            if previous.pinned:
                header = header.with_(ext_flags=header.ext_flags | EXT_PINNED)
        # Other saves in progress hold disk space too; they count as if pinned.
        pinned_bytes = sum(e.file_bytes for e in entries if e.pinned and e.sha != sha) + self.temp_bytes()
        if required + pinned_bytes > self.budget_bytes:
            return failed(f"file of {human_bytes(file_bytes)} (+{self.policy.headroom_percent}% headroom)"
                          f" does not fit the {human_bytes(self.budget_bytes)} budget"
                          + (f" beside {human_bytes(pinned_bytes)} of pinned files" if pinned_bytes else ""))
        # Make room before writing (ds4 does the same), so the directory stays
        # under budget while the new file grows; the file being replaced is not counted.
        others = [e for e in entries if e.sha != sha]
        incoming = eviction.Incoming(text, engine.model_id, engine.payload_abi, header.quant_bits,
                                     engine.ctx_size, created)
        pre = self._evict(others, self.budget_bytes - file_bytes - self.temp_bytes(), incoming=incoming)
        evicted = (pre,) if pre.files else ()
        t0 = time.perf_counter()
        new_name = None
        if fresh and title_b is not None:
            def new_name(created_at: int) -> Path:
                return self.path_for(title_sha(title_b, created_at))
        try:
            final, created = files.write_atomic(self.path_for(sha), header, text, write_payload, tail,
                                                new_name=new_name)
        except Exception as exc:
            return failed(files.describe_failure(exc), *evicted)
        sha = final.name[:40]
        saved = Saved(sha=sha, path=str(self.path_for(sha)), reason=header.reason, tokens=tokens,
                      bytes=file_bytes, ms=_ms(t0), created_at=created)
        # Another process may have saved meanwhile: settle the budget again,
        # never evicting what was just written.
        post = self.evict(protect=(sha,))
        if post.files:
            evicted += (post,)
        return SaveResult(saved, (*evicted, saved))

    def _reusable(self, sha: str, header: KvcHeader, text: bytes, engine: Acceptor) -> Saved | None:
        """An identical untitled checkpoint already on disk: skip rewriting gigabytes."""
        if header.titled:
            return None
        e = inspect_file(self.path_for(sha), acceptor=engine, deep=True, preview_bytes=0)
        h = e.header
        if not e.valid or h.tokens != header.tokens or h.text_bytes != len(text):
            return None
        if self._text_of(e) != text:
            return None
        return Saved(sha=sha, path=e.path, reason=h.reason, tokens=h.tokens, bytes=e.file_bytes,
                     ms=0.0, created_at=h.created_at, reused=True)

    # -- eviction ------------------------------------------------------------

    def evict(self, *, budget_bytes: int | None = None, dry_run: bool = False,
              protect: tuple[str, ...] = ()) -> Evicted:
        """Delete the lowest-scoring files until the directory fits the budget."""
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        entries = self.scan()  # removes dead writers' temp files; live ones count toward the budget
        return self._evict(entries, budget - self.temp_bytes(), frozenset(protect), dry_run=dry_run, budget=budget)

    def temp_bytes(self) -> int:
        """Bytes held by temp files of saves in progress (this process's and others')."""
        return sum(t.bytes for t in files.temp_files(self.dir))

    def _evict(self, entries: list[KvEntry], target: int, protect: frozenset[str] = frozenset(), *,
               dry_run: bool = False, budget: int | None = None,
               incoming: eviction.Incoming | None = None) -> Evicted:
        gone = []
        if sum(e.file_bytes for e in entries) > target:
            self.score(entries, incoming)  # only now: scoring may read texts
        for e in eviction.choose_victims(entries, target, protect):
            if not dry_run:
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    pass  # someone else evicted it: the space is free all the same
                except OSError:
                    continue
            h = e.header
            gone.append(EvictedFile(sha=e.sha or Path(e.path).name, reason=h.reason if h else "unknown",
                                    tokens=h.tokens if h else 0, hits=h.hits if h else 0,
                                    bytes=e.file_bytes, score=e.score.score if e.score else 0.0))
        return Evicted(tuple(gone), sum(f.bytes for f in gone),
                       self.budget_bytes if budget is None else budget, dry_run)
