"""The controller's window on the disk cache: restore, save, titled sessions.

Owns: binding one loaded model to a `KvStore` (what this engine accepts and
writes: model id, payload ABI, quant bits, context size), streaming a
session's payload in and out, listing the titled sessions this very model
wrote (the header only names the family, so the payload's 32-byte fingerprint
is compared too), and moving a titled file to a new title. Every store event
is handed to the caller's callback unchanged.

Leaves to the store: validation, atomic writes, the budget and eviction; to
the controller: when to save and what the text is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable

from ds4tui.cache.entry import Acceptor, inspect_file
from ds4tui.cache.events import Miss, Rejected, Saved
from ds4tui.cache.files import read_text
from ds4tui.cache.loading import LoadWithText
from ds4tui.format.kvc import PREFIX_BYTES, KvcFormatError, KvcHeader, read_kvc, title_sha
from ds4tui.cache.policy import CachePolicy
from ds4tui.cache.safe_open import CacheDirError, open_regular
from ds4tui.cache.store import KvStore
from ds4tui.chat.matching import match_sessions
from ds4tui.chat.model_memo import remember, spec_for
from ds4tui.format.payload import read_fingerprint
from ds4tui.engine.errors import EngineError

if TYPE_CHECKING:  # annotations only: SavedSession (and chat/legacy_transcripts.py) stay torch-free
    from ds4tui.engine.model import Model
    from ds4tui.engine.session import Session


# The problem of a titled session written by another model of the same family (SmolLM2 and
# Gemma 3 are both llama-family) or other weights: the file is fine, this model cannot load it.
OTHER_WEIGHTS = "written by another model of this family (or other weights): resume it with that model"


def other_model_problem(spec: str | None, sha: str) -> str:
    """Why a session of another model of the family does not open here, naming that model when
    this cache directory noted it (chat/model_memo.py)."""
    if spec is None:
        return OTHER_WEIGHTS
    return f"written by {spec}: `ds4tui --resume {sha[:12]}` opens it with that model"


# The tokens a turn will prefill after a restored file that stores `text`; None: none known.
SuffixFor = Callable[[bytes], "list[int] | None"]


@dataclass(frozen=True)
class SavedSession:
    """A titled session file on disk, as the conversation list shows it."""

    sha: str
    path: str
    title: str | None  # None: an untitled checkpoint (a prompt prefix)
    created_at: int
    last_used: int
    tokens: int
    file_bytes: int
    ctx_size: int = 0  # the context it was written with (0: not known, a remote transcript)
    # Why it cannot be resumed (corrupt, written by another config, ...); None when it can.
    problem: str | None = None
    other_model: bool = False  # the problem is only that another model of the family wrote it

    @property
    def titled(self) -> bool:
        return self.title is not None


class Checkpoints:
    """One model's checkpoints in one cache directory."""

    def __init__(self, model: Model, directory: str | os.PathLike, policy: CachePolicy,
                 ctx_size: int | None = None, model_spec: str | None = None) -> None:
        self.model = model
        self.store = KvStore(directory, policy, budget_mb=policy.budget_mb)
        self._ctx_size = ctx_size
        # Noted in the directory's model memo at the first save (chat/model_memo.py), so that
        # `--resume` opens these sessions with this model; None: not noted (tests, benches).
        self._model_spec = model_spec
        # (sha, size) -> why its last load was refused (e.g. checksum mismatch, which a listing
        # does not read the whole file to find): the titled list marks it.
        self._refused: dict[tuple[str, int], str] = {}

    def acceptor(self, session: Session | None = None) -> Acceptor:
        """What this engine loads (files for a larger context are refused) and writes."""
        info = self.model.info
        ctx = session.ctx_size if session is not None else self._ctx_size
        return Acceptor(model_id=info.model_id, payload_abi=info.payload_abi, ctx_size=ctx,
                        quant_bits=info.quant_bits, fingerprint=info.fingerprint)

    def prime(self, ctx_size: int) -> None:
        """Read the cache's headers and titled texts now (a controller's warm_up), not in the
        first message's lookup."""
        self.store.prime_lookup(replace(self.acceptor(), ctx_size=ctx_size))

    # -- restore ---------------------------------------------------------------------------------

    def restore_longest(self, prompt: bytes, session: Session, on_event: Callable,
                        suffix_for: SuffixFor | None = None) -> int:
        """Load the longest cached byte prefix of `prompt` into `session`; bytes covered (0: miss).

        suffix_for(text): the tokens the caller will prefill after a file storing `text`
        (None: it will not), handed to the session's load (Session.load_payload_ahead)."""
        result = self.store.load(prompt, self.acceptor(session), _loader(session, suffix_for))
        for ev in result.events:
            on_event(ev)
        hit = result.hit
        if hit is None:
            session.reset()  # a rejected payload may have left it empty; make sure of it
            return 0
        return hit.text_bytes

    def first_prefix(self, prompt: str, saved_sha: str | None, ctx_size: int) -> tuple[int, str] | None:
        """(tokens, the prompt's text after them) of the file a turn would restore for `prompt`
        into an empty session of `ctx_size`: the chat's own titled file when it starts the
        prompt (restore_titled), else the longest cached prefix (restore_longest). From the
        headers and the stored text alone, no payload read; None when no file applies. (A file
        whose payload then fails to load makes the turn try the next one, or start cold.)"""
        acceptor = replace(self.acceptor(), ctx_size=ctx_size)
        titled = self._titled_start(saved_sha, prompt, acceptor) if saved_sha else None
        if titled is not None:
            header, text = titled
            return header.tokens, text_after(prompt, text)
        prompt_bytes = prompt.encode("utf-8")
        try:
            candidates = self.store.lookup(prompt_bytes, acceptor)
        except CacheDirError:
            return None
        if not candidates or candidates[0].header is None:
            return None
        rest = text_after_bytes(prompt_bytes, candidates[0].header.text_bytes)
        if rest is None:
            return None  # the prefix ends inside a character: the turn starts cold
        return candidates[0].header.tokens, rest

    def _titled_start(self, sha: str, prompt: str, acceptor: Acceptor) -> tuple[KvcHeader, bytes] | None:
        """(header, stored text) of the titled file `sha` when `acceptor` takes it and its text
        starts `prompt` (text_after); None otherwise. Headers and text only, no payload read."""
        path = self.store.path_for(sha)
        e = inspect_file(path, acceptor=acceptor, deep=False, preview_bytes=0)
        if not e.valid or e.header is None:
            return None
        text = read_text(path, e.header.text_bytes)
        if text is None or text_after(prompt, text) is None:
            return None
        return e.header, text

    def restore_titled(self, sha: str, prompt: str, session: Session, on_event: Callable,
                       suffix_for: SuffixFor | None = None) -> bytes | None:
        """Load one titled file whose transcript starts `prompt` (a parked chat's own file;
        lookup by text never finds titled files); its text, or None when it does not apply.

        Compared as decoded text, as the chat compares its live session: a reply holding
        invalid UTF-8 is stored as its bytes but shown (and rendered again) with U+FFFD.
        suffix_for: as for restore_longest.
        """
        titled = self._titled_start(sha, prompt, self.acceptor(session))
        if titled is None:
            return None
        _, text = titled
        result = self.store.load_file(sha, self.acceptor(session), _loader(session, suffix_for))
        for ev in result.events:
            if not isinstance(ev, Miss):
                on_event(ev)
        if result.hit is None:
            session.reset()
            return None
        return text

    def load_saved(self, saved: SavedSession, session: Session, on_event: Callable) -> bytes:
        """Restore one file into `session`; returns its rendered text. Raises EngineError when it fails."""
        result = self.store.load_file(saved.sha, self.acceptor(session), _loader(session))
        for ev in result.events:
            on_event(ev)
        if result.hit is None:
            reason = result.event.reason if isinstance(result.event, Miss) else "not loaded"
            self._refused[(saved.sha, saved.file_bytes)] = reason  # marked in the list from now on
            raise EngineError(f"cannot resume {saved.title or saved.sha[:12]!r}: {reason}")
        try:
            with open_regular(saved.path) as fp:
                return read_kvc(fp, with_trailers=False).text
        except (OSError, KvcFormatError) as exc:
            session.reset()
            raise EngineError(f"cannot resume {saved.title or saved.sha[:12]!r}: {exc}") from None

    # -- save -------------------------------------------------------------------------------------

    def save(self, session: Session, text: bytes, reason: str, on_event: Callable, *,
             title: str | None = None, created_at: int | None = None) -> str | None:
        """Checkpoint the whole session under `reason`; the file's sha, or None when it failed.

        A failure (full disk, budget) is reported as the store's SaveFailed event and
        never raised: the conversation goes on without this checkpoint.
        """
        result = self.store.save(
            text, tokens=len(session.tokens), reason=reason, engine=self.acceptor(session),
            payload_bytes=session.payload_bytes(), write_payload=session.save_payload,
            title=title, created_at=created_at,
        )
        for ev in result.events:
            on_event(ev)
        self._note_model(result.ok)
        return result.event.sha if result.ok else None

    def save_titled(self, session: Session, text: bytes, on_event: Callable, *, title: str, created_at: int,
                    owned_sha: str | None) -> Saved | None:
        """Save a titled session (reason agent-session); the Saved event, or None when it failed.

        `owned_sha` is the file this conversation already has: saving under that
        name replaces it. Any other name is claimed fresh, never replacing a file,
        so two sessions never share one; its created_at may then be bumped (see
        KvStore.save) and the caller must keep the one in the returned event."""
        fresh = owned_sha is None or title_sha(title.encode("utf-8"), created_at) != owned_sha
        result = self.store.save(
            text, tokens=len(session.tokens), reason="agent-session", engine=self.acceptor(session),
            payload_bytes=session.payload_bytes(), write_payload=session.save_payload,
            title=title, created_at=created_at, fresh=fresh,
        )
        for ev in result.events:
            on_event(ev)
        self._note_model(result.ok)
        return result.event if result.ok else None

    def _note_model(self, saved: bool) -> None:
        """After the first file this model saved here: note the model (once per process)."""
        if saved and self._model_spec is not None:
            remember(self.store.dir, self.model.info.fingerprint_hex, self._model_spec)
            self._model_spec = None

    def delete(self, sha: str) -> bool:
        return self.store.delete(sha)

    def pinned(self, sha: str) -> bool:
        """Whether the file `sha` is there and pinned (kept on purpose: a delete asks twice)."""
        path = self.store.path_for(sha)
        return path.exists() and inspect_file(path, deep=False).pinned

    def retitle(self, sha: str, title: str, created_at: int, on_event: Callable) -> str | None:
        """Move a titled file to its new name (the store copies it, tool map included, then
        deletes the old one); returns the new SHA, or None when it could not be moved."""
        try:
            return self.store.rename_title(sha, title)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            on_event(Rejected(sha, f"cannot rename: {exc}"))
            return None

    # -- titled sessions ---------------------------------------------------------------------------

    def describe(self, sha: str) -> SavedSession:
        """One file as a SavedSession; LookupError when it is missing or not loadable here."""
        e = inspect_file(self.store.path_for(sha), acceptor=self.acceptor(), deep=True, preview_bytes=0)
        if not e.valid or e.header is None:
            raise LookupError(f"{sha[:12]}: {e.error or 'not a cache file'}")
        h = e.header
        return SavedSession(sha=sha, path=e.path, title=e.title if h.titled else None, created_at=h.created_at,
                            last_used=h.last_used, tokens=h.tokens, file_bytes=e.file_bytes, ctx_size=h.ctx_size)

    def titled_sessions(self, *, with_problems: bool = False) -> list[SavedSession]:
        """Titled sessions written by this model (same fingerprint), newest first.

        `with_problems`: also the titled files of this model that cannot be resumed
        (corrupt, truncated, written by another config of the family, or refused
        at their last load), each with its `problem`, so none drops out of a list
        without a word. Files whose header does not decode are not known to be
        titled; `kv ls` shows them."""
        acc = self.acceptor()
        out = []
        try:
            entries = self.store.scan(deep=True, acceptor=acc)  # also repairs ds4-rewritten headers
        except CacheDirError:
            return []  # the directory went away or changed into a file; saves say why
        for e in entries:
            h = e.header
            if h is None or not h.titled or e.sha is None or h.model_id != acc.model_id:
                continue
            problem = None if e.valid else e.error
            fingerprint = _payload_fingerprint(e.path, h.text_bytes, h.payload_bytes)
            # Another model of the family: its weights' bits (Q4 vs Q5...) or its fingerprint differ.
            other = bool(e.not_loadable and acc.quant_bits is not None and h.quant != acc.quant_bits) or (
                problem is None and fingerprint != self.model.info.fingerprint)
            if other:
                problem = other_model_problem(spec_for(self.store.dir, fingerprint.hex() if fingerprint else None),
                                              e.sha)
            problem = problem or self._refused.get((e.sha, e.file_bytes))
            if problem is not None and not with_problems:
                continue
            title = e.title if e.title is not None else f"(unreadable title) {e.sha[:12]}"
            out.append(SavedSession(sha=e.sha, path=e.path, title=title, created_at=h.created_at,
                                    last_used=h.last_used, tokens=h.tokens, file_bytes=e.file_bytes,
                                    ctx_size=h.ctx_size, problem=problem, other_model=other))
        out.sort(key=lambda s: (s.last_used, s.created_at), reverse=True)
        return out

    def find_titled(self, query: str, *, with_problems: bool = False) -> list[SavedSession]:
        """Sessions `query` names: a file-name prefix, the title, or the start of the title
        (chat/matching.py, the rule `--resume` uses too); `with_problems`: among those that
        cannot be resumed too."""
        return match_sessions(query, self.titled_sessions(with_problems=with_problems),
                              lambda s: s.sha, lambda s: s.title or "")


def text_after(prompt: str, stored: bytes) -> str | None:
    """The prompt's text after a stored transcript that starts it, None when it does not.
    Compared as decoded text, as the chat compares its live session: a reply holding invalid
    UTF-8 is stored as its bytes but shown (and rendered again) with U+FFFD."""
    have = stored.decode("utf-8", errors="replace")
    return prompt[len(have):] if prompt.startswith(have) else None


def text_after_bytes(prompt_bytes: bytes, start: int) -> str | None:
    """The prompt's text after its first `start` bytes (a cached prefix found by bytes), or
    None when `start` splits a UTF-8 character."""
    try:
        return prompt_bytes[start:].decode("utf-8")
    except UnicodeDecodeError:
        return None


def _loader(session: Session, suffix_for: SuffixFor | None = None) -> Callable[[BinaryIO, int], int] | LoadWithText:
    if suffix_for is None:
        def load(fp: BinaryIO, nbytes: int) -> int:
            session.load_payload(fp, nbytes)
            return len(session.tokens)

        return load

    def load_ahead(fp: BinaryIO, nbytes: int, text: bytes) -> int:
        session.load_payload_ahead(fp, nbytes, suffix_for(text) or ())
        return len(session.tokens)

    return LoadWithText(load_ahead)


def _payload_fingerprint(path: str | Path, text_bytes: int, payload_bytes: int) -> bytes | None:
    """The model fingerprint of a ds4tui file's payload; None when unreadable."""
    try:
        with open_regular(path) as fp:
            return read_fingerprint(fp, PREFIX_BYTES + text_bytes, payload_bytes)
    except OSError:
        return None
