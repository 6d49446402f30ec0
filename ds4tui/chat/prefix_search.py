"""Where a turn's prompt starts from: the chat's live session, another chat's idle one (a
fork of the shared prefix), the longest cached file, or nothing (cold).

Owns `PrefixSearch.prepare`, the searches in that order, each leaving the chat's session
holding the prefix it found and its exact text (`conv.session_text`), and `Prefix`, what the
turn (turn.py) then prefills. Leaves to others: which sessions stay in memory and the forks
(pool.py, sharing.py), the files (checkpoints.py over ds4tui.cache).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Callable, Sequence

from ds4tui.cache.events import Hit, Miss, Rejected
from ds4tui.cache.policy import CachePolicy
from ds4tui.chat.checkpoints import Checkpoints, text_after, text_after_bytes
from ds4tui.chat.conversation import Conversation
from ds4tui.chat.events import ChatEvent
from ds4tui.chat.live_suffix import suffix_after_live
from ds4tui.chat.pool import SessionPool
from ds4tui.chat.sharing import best_share, stable_point
from ds4tui.engine.model import Model
from ds4tui.engine.session import Session
from ds4tui.engine.text.prefix import common_prefix

EventFn = Callable[[ChatEvent], None]


@dataclass(frozen=True)
class Prefix:
    """What PrefixSearch.prepare found: the tokens still to prefill and where the rest came from."""

    suffix: list[int]
    source: str  # live, fork, disk, cold
    replayed: int = 0
    sha: str | None = None
    ms: float | None = None
    reason: str | None = None


def shared_tokens(tokenizer, tokens: Sequence[int], session_text: bytes, text: str) -> tuple[int, int, int]:
    """How much of a session `text` can reuse: (k, nbytes, nchars) for the most tokens k whose
    text (nbytes of session_text, nchars characters once decoded) is a prefix of `text`.

    Compared as decoded text, as the transcript holds it: a reply with invalid UTF-8 bytes
    shows them as U+FFFD. Only boundaries where no character is left half-decoded count.
    """
    have = session_text.decode("utf-8", errors="replace")
    limit = common_prefix(have, text)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tb = tokenizer.token_bytes
    k = nbytes = nchars = 0
    best = (0, 0, 0)
    for t in tokens:
        piece = tb(t)
        nchars += len(decoder.decode(piece))
        if nchars > limit:
            break
        k, nbytes = k + 1, nbytes + len(piece)
        if not decoder.getstate()[0]:
            best = (k, nbytes, nchars)
    return best


def token_text(tokenizer, tokens: Sequence[int]) -> bytes:
    """The exact bytes `tokens` stand for (the text a checkpoint of them stores)."""
    tb = tokenizer.token_bytes
    return b"".join(tb(t) for t in tokens)


class PrefixSearch:
    def __init__(self, model: Model, pool: SessionPool, checkpoints: Checkpoints | None,
                 policy: CachePolicy) -> None:
        self.model = model
        self.pool = pool
        self.checkpoints = checkpoints
        self.policy = policy

    def prepare(self, conv: Conversation, prompt: str, prompt_bytes: bytes,
                 on_event: EventFn) -> Prefix:
        """Make conv.session cover the longest known prefix; return the tokens still to prefill.

        Afterwards conv.session_text is the exact text of the session's tokens.
        """
        session = conv.session
        if session is not None and session.tokens:
            live = self._from_live(conv, session, prompt, prompt_bytes)
            if live is not None:
                return live
        shared = self._share(conv, prompt, on_event)
        if shared is not None:
            return shared
        session = self.pool.ensure(conv, on_event)
        if self.checkpoints is None:
            on_event(Miss("disk cache off (--no-disk-cache)"))
            reason = "disk cache off"
        else:
            found = self._from_disk(conv, session, prompt, prompt_bytes, self.checkpoints, on_event)
            if isinstance(found, Prefix):
                return found
            reason = found
        session.reset()
        conv.session_text = b""
        conv.stored_upto = 0
        return Prefix(self.model.tokenizer.encode(prompt), "cold", reason=reason)

    def _from_live(self, conv: Conversation, session: Session, prompt: str, prompt_bytes: bytes) -> Prefix | None:
        """The rest of the prompt after conv's live session (rewound where the prompt leaves its
        text), or None when the session does not lead into the prompt."""
        tok = self.model.tokenizer
        # The check below without encoding the whole transcript, when that is certain to
        # give its answer (live_suffix.py); else the check itself.
        quick = suffix_after_live(tok, session.tokens, conv.session_text, prompt_bytes)
        if quick is not None and (quick or session.logits is not None):
            return Prefix(quick, "live")
        full = tok.encode(prompt)
        n = len(session.tokens)
        if full[:n] == session.tokens and (len(full) > n or session.logits is not None):
            # Same tokens as a cold prefill would use: the answer is bit-identical.
            return Prefix(full[n:], "live")
        # The reply's sampled tokens need not match a re-tokenization of its text;
        # the session's own tokens stay authoritative and only the new text is
        # encoded. Compared as decoded text: a reply holding invalid UTF-8 is kept
        # in the transcript with U+FFFD, exactly as this decode shows it.
        have = conv.session_text.decode("utf-8", errors="replace")
        if prompt.startswith(have) and (session.logits is not None or len(prompt) > len(have)):
            return Prefix(tok.encode(prompt[len(have):]), "live")
        return self._rewind_live(conv, session, prompt)

    def _from_disk(self, conv: Conversation, session: Session, prompt: str, prompt_bytes: bytes,
                   checkpoints: Checkpoints, on_event: EventFn) -> Prefix | str:
        """Restore the longest cached prefix into `session` (a parked titled chat's own file
        first); the rest of the prompt, or why nothing was restored."""
        tok = self.model.tokenizer
        reason = "no cached prefix"
        seen: list = []

        def note(event: ChatEvent) -> None:
            seen.append(event)
            on_event(event)

        # The rest of the prompt after a file's text, tokenized once the store has checked
        # the file and before its payload: the session runs its first chunk while the
        # rows are still coming from disk (LlamaSession.load_payload_ahead), and the
        # prefill below takes that chunk as done. Kept per text: tokenized once.
        suffixes: dict[bytes, list[int]] = {}

        def suffix_after(text: bytes, rest: str | None) -> list[int] | None:
            if rest is None:
                return None
            if text not in suffixes:
                suffixes[text] = tok.encode(rest)
            return suffixes[text]

        if conv.saved_sha:  # a parked titled chat (a fork, a resumed one): its own file first
            text = checkpoints.restore_titled(conv.saved_sha, prompt, session, note,
                                                   lambda t: suffix_after(t, text_after(prompt, t)))
            if text is not None:
                conv.session_text = text
                conv.stored_upto = len(session.tokens)
                hit = next((e for e in reversed(seen) if isinstance(e, Hit)), None)
                suffix = suffix_after(text, text_after(prompt, text))
                assert suffix is not None  # restore_titled checked that its text starts the prompt
                return Prefix(suffix, "disk", sha=conv.saved_sha, ms=hit.ms if hit else None)
        covered = checkpoints.restore_longest(
            prompt_bytes, session, note, lambda t: suffix_after(t, text_after_bytes(prompt_bytes, len(t))))
        if covered:
            suffix = suffix_after(prompt_bytes[:covered], text_after_bytes(prompt_bytes, covered))
            if suffix is not None:
                conv.session_text = prompt_bytes[:covered]
                conv.stored_upto = len(session.tokens)
                hit = next((e for e in reversed(seen) if isinstance(e, Hit)), None)
                return Prefix(suffix, "disk", sha=hit.sha if hit else None, ms=hit.ms if hit else None)
            reason = "cached prefix ends inside a character"
        rejected = [e for e in seen if isinstance(e, Rejected)]
        if rejected:
            reason = f"file rejected: {rejected[-1].reason}"
        return reason

    def _share(self, conv: Conversation, prompt: str, on_event: EventFn) -> Prefix | None:
        """Fork another chat's idle live session where it shares more of the prompt's tokens
        than any cached file (sharing.py); None when none does. The fork holds the prompt's
        own tokens (a cold prefill's), so only the chunking of their rows differs from one.
        A shared point at least min_tokens past what the disk holds is checkpointed (reason
        cold) first: after a restart the prompts that share it find it on disk."""
        if conv.session is not None and conv.session.tokens:
            return None  # its own session, which the live path could not use: the disk decides
        donors = [c for c in self.pool.conversations.live()
                  if c is not conv and not c.busy and c.session is not None and c.session.tokens]
        if not donors:
            return None
        tok = self.model.tokenizer
        full = tok.encode(prompt)
        share = best_share(donors, full)
        if share is None:
            return None
        on_disk = 0
        if self.checkpoints is not None:
            found = self.checkpoints.first_prefix(prompt, conv.saved_sha, self.pool.ctx_size())
            on_disk = found[0] if found is not None else 0
        if on_disk > share.tokens:
            return None  # on a tie the fork: a copy in memory costs less than a file read
        at, keep = share.tokens, False
        point = stable_point(tok, full, at, self.policy.boundary_trim_tokens)
        # Worth a file of its own: at least min_tokens past what the disk holds (else a near copy).
        if (self.checkpoints is not None and not share.whole and point - on_disk >= self.policy.min_tokens
                and self.policy.cold_allowed(point)):
            at, keep = point, True  # a few tokens back, to a point other prompts can reuse
        # What the fork gets without computing: a family that rewinds from its nearest mark
        # (DeepSeek V4) re-runs the tokens after it; a full-KV layer only lacks the logits,
        # which the prefill after the fork computes anyway.
        cost = share.donor.session.rewind_cost(at)
        free = at if cost.how in ("recompute", "none", "kept") else at - cost.replay
        if free <= 0 or on_disk > free:
            return None
        session = self.pool.share(conv, share.donor, at, on_event, logits=share.whole and not keep)
        conv.session_text = token_text(self.model.tokenizer, session.tokens)
        conv.stored_upto = 0
        if keep and self.checkpoints is not None and self.checkpoints.save(session, conv.session_text, "cold", on_event):
            conv.stored_upto = at
        return Prefix(full[at:], "fork")

    def _rewind_live(self, conv: Conversation, session: Session, prompt: str) -> Prefix | None:
        """The prompt leaves the live session somewhere inside its text (a regenerated reply,
        an edited message, a switched alternative): rewind to the last token boundary the
        two share, when the session can get there from memory (a mark, or full KV)."""
        k, nbytes, nchars = shared_tokens(self.model.tokenizer, session.tokens, conv.session_text, prompt)
        if k == 0:
            return None
        cost = session.rewind_cost(k)
        if cost.restore_from == 0:
            return None  # nothing kept in memory before k: a disk prefix may do better
        session.rewind(k)
        conv.session_text = conv.session_text[:nbytes]
        conv.stored_upto = min(conv.stored_upto, k)
        rest = prompt[nchars:]
        return Prefix(self.model.tokenizer.encode(rest) if rest else [], "live", replayed=cost.replay)
