"""One turn of a chat, headless: prompt -> longest cached prefix -> prefill the rest -> stream.

Owns the pipeline of a turn: render the messages with the model's chat template,
reuse the conversation's live session when it covers a prefix of the new prompt,
else fork another chat's live session where it shares more of the prompt than any
cached file (sharing.py), else restore the longest cached prefix from disk, else start cold; prefill only
the rest (in the engine's aligned chunks, with progress and cancellation), split
where the policy wants a cold or continued checkpoint; stream the reply as whole
characters until EOS, a stop string, the token limit or a cancel, checkpointing
it where it reaches a continued frontier.

Leaves to others: which sessions stay in memory (pool.py), file formats and the
budget (checkpoints.py over ds4tui.cache), the math (ds4tui.engine).
"""

from __future__ import annotations

import codecs
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ds4tui.cache.events import Hit, Miss, Rejected
from ds4tui.cache.policy import CachePolicy
from ds4tui.chat.checkpoints import Checkpoints, text_after, text_after_bytes
from ds4tui.chat.conversation import Conversation
from ds4tui.chat.events import (
    CacheReport, Cancelled, ChatEvent, Done, PrefillProgress, PrefillStarted, TokenText,
)
from ds4tui.chat.live_suffix import suffix_after_live
from ds4tui.chat.pool import SessionPool
from ds4tui.chat.settings import Settings
from ds4tui.chat.sharing import anchor_tokens, best_share, stable_point
from ds4tui.chat.streaming import ReplyStream
from ds4tui.engine.errors import ContextFullError
from ds4tui.engine.model import Model
from ds4tui.engine.sampling import Sampler, SamplingParams
from ds4tui.engine.session import Session
from ds4tui.engine.text.prefix import common_prefix

EventFn = Callable[[ChatEvent], None]


@dataclass(frozen=True)
class TurnOptions:
    """What one turn may set for itself instead of the chat's settings (the server sets them
    per request). None / empty: the settings' value, the template's stop strings only."""

    sampling: SamplingParams | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()  # stop strings on top of the chat template's own
    cancel: threading.Event | None = None  # this turn's own cancel flag (default: the controller's)
    # A scheduler sharing the engine between turns (serve/scheduler.py): `between` is called
    # between prefill chunks (others run meanwhile), `decode` replaces session.decode (it may
    # run the step together with other turns' decodes).
    between: Callable[[], None] | None = None
    drop_partial: bool = False  # a reply cut inside a character ends before it (no U+FFFD)
    tools: tuple[dict, ...] = ()  # function definitions for templates that render them (the server's)
    prompt: str | None = None  # a plain-text prompt taken as it is, no template (/v1/completions)
    decode: Callable[[Session, int], object] | None = None


@dataclass(frozen=True)
class Prefix:
    """What _prepare found: the tokens still to prefill and where the rest came from."""

    suffix: list[int]
    source: str  # live, fork, disk, cold
    replayed: int = 0
    sha: str | None = None
    ms: float | None = None
    reason: str | None = None


def render_prompt(chat, messages: Sequence[dict], now, tools: Sequence[dict] = ()) -> str:
    """The turn's prompt: the messages through the chat template, with the tools when there are
    any (only templates that render tools take them: JinjaChatTemplate)."""
    if tools:
        return chat.render(messages, add_generation_prompt=True, now=now, tools=list(tools))
    return chat.render(messages, add_generation_prompt=True, now=now)


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


class TurnPipeline:
    def __init__(self, model: Model, settings: Settings, pool: SessionPool, checkpoints: Checkpoints | None,
                 policy: CachePolicy, stop: threading.Event) -> None:
        self.model = model
        self.settings = settings
        self.pool = pool
        self.checkpoints = checkpoints
        self.policy = policy
        self._stop = stop  # set by the controller's cancel(), from any thread

    def run(self, conv: Conversation, on_event: EventFn, options: TurnOptions | None = None, *,
            seed_offset: int = 0, regenerated: bool = False) -> Done | None:
        """Generate the reply to conv's messages. None when cancelled during the prefill."""
        options = options or TurnOptions()
        cancel = options.cancel or self._stop
        t0 = time.perf_counter()
        prompt = options.prompt if options.prompt is not None else render_prompt(
            self.model.chat, conv.messages, conv.template_now, options.tools)
        prompt_bytes = prompt.encode("utf-8")
        found = self._prepare(conv, prompt, prompt_bytes, on_event)
        suffix, source = found.suffix, found.source
        session = conv.session
        assert session is not None
        session.set_storage_policy(self.settings.config.swa_policy)  # a change made while this chat was busy
        base, base_text = len(session.tokens), conv.session_text
        if base + len(suffix) > session.ctx_size:  # refuse now, not after prefilling what fits
            raise ContextFullError(f"context full: the prompt needs {base + len(suffix)} tokens,"
                                   f" the context holds {session.ctx_size}")
        on_event(PrefillStarted(total=len(suffix), cached=base, source=source))
        anchor = 0
        if source == "cold" and options.prompt is None and self.checkpoints is not None:
            anchor = anchor_tokens(lambda m: render_prompt(self.model.chat, m, conv.template_now, options.tools),
                                   self.model.tokenizer, conv.messages, prompt, suffix)
        if not self._prefill(conv, suffix, source, on_event, cancel, options.between, anchor):
            prefilled = len(session.tokens) - base
            self._back_to(conv, base, base_text)
            on_event(Cancelled(prefilled=prefilled))
            return None
        # The session now holds the prompt: its old tokens plus the suffix.
        conv.session_text = base_text + self.text_of(suffix)
        prefill_s = time.perf_counter() - t0
        report = CacheReport(source=source, reused=base, prefilled=len(suffix), replayed=found.replayed,
                             sha=found.sha, ms=found.ms, reason=found.reason)
        done = self._generate(conv, on_event, t0, len(suffix), prefill_s, options, cancel, seed_offset)
        done = replace(done, cache=report, regenerated=regenerated,
                       forward_before_first_token=bool(suffix) or found.replayed > 0)
        on_event(done)
        return done

    def text_of(self, tokens: Sequence[int]) -> bytes:
        """The exact bytes `tokens` stand for (the text a checkpoint of them stores)."""
        tb = self.model.tokenizer.token_bytes
        return b"".join(tb(t) for t in tokens)

    def _prepare(self, conv: Conversation, prompt: str, prompt_bytes: bytes,
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
        conv.session_text = self.text_of(session.tokens)
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

    def _back_to(self, conv: Conversation, base: int, base_text: bytes) -> None:
        """A cancelled prefill: the session returns to where the turn found it (`base` tokens, the
        mark _prefill kept there), so the chat's context is what it was before the message
        (which the controller withdraws). Checkpoints saved on the way stay in the disk cache."""
        session = conv.session
        assert session is not None
        if len(session.tokens) > base:
            session.rewind(base)
        conv.session_text = base_text
        conv.stored_upto = min(conv.stored_upto, base)

    def _prefill(self, conv: Conversation, suffix: Sequence[int], source: str, on_event: EventFn,
                 cancel: threading.Event, between: Callable[[], None] | None = None, anchor: int = 0) -> bool:
        """Prefill `suffix`, pausing at checkpoint points; False when cancelled (state stays consistent:
        whole chunks, `run` then rewinds to the start). A cancel is seen between chunks and, where
        the engine can undo a half-run chunk (both families do), between the layers of one: a
        stop takes one layer's compute, not a chunk's. `between`: called before each chunk (a
        scheduler's yield point); `anchor`: a cold prompt's stable prefix in tokens
        (sharing.anchor_tokens), 0 when it has none."""
        session = conv.session
        assert session is not None
        base, base_text = len(session.tokens), conv.session_text
        # Where a cancel rewinds to, kept for free when the session can (a full-KV layer keeps
        # its rows anyway: the mark is the logits); dropped again once the prompt is in.
        had_mark = base in session.marks()
        session.keep_mark()
        end = base + len(suffix)
        stops = self._checkpoint_points(conv, base, end, cold=(source == "cold"), anchor=anchor)
        total = len(suffix)
        started = time.perf_counter()
        offset = 0
        should_stop = cancel.is_set
        if between is not None:
            def should_stop() -> bool:
                between()
                return cancel.is_set()

        def progress(done: int, _total: int) -> None:
            done += offset
            elapsed = time.perf_counter() - started
            rate = done / elapsed if elapsed > 0 else 0.0
            eta = (total - done) / rate if rate > 0 else None
            on_event(PrefillProgress(done=done, total=total, tok_s=rate, eta_s=eta))

        for at, reason in stops + [(end, None)]:
            seg = suffix[offset : at - base]
            if seg and not session.prefill(seg, on_progress=progress, should_stop=should_stop,
                                           interrupt=cancel.is_set):
                conv.session_text = base_text + self.text_of(session.tokens[base:])
                return False
            offset = at - base
            if reason is not None and self.checkpoints is not None:
                conv.session_text = base_text + self.text_of(session.tokens[base:])
                if self.checkpoints.save(session, conv.session_text, reason, on_event):
                    conv.stored_upto = len(session.tokens)
        if not had_mark:
            session.drop_mark(base)
        return True

    def _checkpoint_points(self, conv: Conversation, base: int, end: int, cold: bool,
                           anchor: int = 0) -> list[tuple[int, str]]:
        """Absolute token counts inside (base, end] where the policy wants a checkpoint. A cold
        prompt's checkpoint goes at its anchor (the end of its stable chat prefix) when that
        is long enough, else at the policy's trimmed and aligned length (ds4's choice)."""
        if self.checkpoints is None:
            return []
        points: dict[int, str] = {}
        policy = self.policy
        if cold and base == 0 and policy.cold_allowed(end):
            n = anchor if anchor >= policy.min_tokens else policy.store_len(end)
            if n > 0:
                points[n] = "cold"
        frontier = policy.next_continued_frontier(max(conv.stored_upto, base))
        step = policy.continued_step
        while frontier and step and frontier <= end:
            if frontier > base:
                points.setdefault(frontier, "continued")
            frontier += step
        return sorted(points.items())

    def _continued_in_reply(self, conv: Conversation, session: Session, text: bytearray, on_event: EventFn) -> None:
        """A reply that reaches a continued frontier is checkpointed there, as ds4 checks the
        frontier at every decode step (ds4_server.c, kv_cache_maybe_store_continued): a kill -9
        during a long reply, or before the next save, loses at most one interval."""
        if self.checkpoints is None or not self.policy.continued_target(len(session.tokens), conv.stored_upto):
            return
        if self.checkpoints.save(session, bytes(text), "continued", on_event):
            conv.stored_upto = len(session.tokens)

    def _generate(self, conv: Conversation, on_event: EventFn, t0: float, prompt_tokens: int,
                  prefill_s: float, options: TurnOptions, cancel: threading.Event, seed_offset: int = 0) -> Done:
        """Long because the decode loop and what it measures (time to first token, sampling's CPU time, stops)
        share its locals, step by step."""
        session = conv.session
        assert session is not None and session.logits is not None
        tok = self.model.tokenizer
        params = options.sampling or self.settings.sampling_params(conv)
        if seed_offset and params.seed is not None:
            params = replace(params, seed=params.seed + seed_offset)  # a seeded regenerate still differs
        sampler = Sampler(params)
        stream = ReplyStream(tuple(self.model.chat.stop_strings) + options.stop, drop_partial=options.drop_partial)
        max_tokens = options.max_tokens or self.settings.max_tokens(conv)
        eos = tok.eos_ids
        decode = options.decode
        logits = session.logits
        text = bytearray(conv.session_text)
        generated, stop, ttft = 0, "max-tokens", None
        # What sampling costs, for the stats line: this thread's CPU time, so the waits for
        # the GIL while the UI renders (the app) are not put down to the sampler.
        sampler_s = 0.0
        started = time.perf_counter()
        while generated < max_tokens:
            if cancel.is_set():
                stop = "cancelled"
                break
            before = time.thread_time()
            token = sampler(logits)
            sampler_s += time.thread_time() - before
            if ttft is None:
                ttft = (time.perf_counter() - t0) * 1000.0
            if token in eos:
                stop = "eos"
                break
            if len(session.tokens) >= session.ctx_size:
                stop = "context-full"
                break
            piece = tok.token_bytes(token)
            out = stream.feed(piece)
            if out:
                on_event(TokenText(out))
            logits = session.decode(token) if decode is None else decode(session, token)
            text += piece
            generated += 1
            self._continued_in_reply(conv, session, text, on_event)
            if stream.stopped:
                stop = "stop-string"
                break
        tail = stream.finish()
        if tail:
            on_event(TokenText(tail))
        conv.session_text = bytes(text)
        conv.messages.append({"role": "assistant", "content": stream.text})
        conv.resumed_stop = None  # the resumed chat's last reply is no longer its last
        decode_s = time.perf_counter() - started
        done = Done(
            tokens=generated,
            tok_s=generated / decode_s if decode_s > 0 and generated else 0.0,
            prompt_tokens=prompt_tokens,
            prefill_tok_s=prompt_tokens / prefill_s if prefill_s > 0 else 0.0,
            ttft_ms=ttft if ttft is not None else prefill_s * 1000.0,
            context_tokens=len(session.tokens),
            stop=stop,
            sampled=params.temperature > 0,
            sampler_ms=sampler_s * 1000.0,
        )
        return done
