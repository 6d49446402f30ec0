"""One turn of a chat, headless: prompt -> longest cached prefix -> prefill the rest -> stream.

Owns the pipeline of a turn: render the messages with the model's chat template,
reuse the conversation's live session when it covers a prefix of the new prompt,
else fork another chat's live session where it shares more of the prompt than any
cached file (sharing.py), else restore the longest cached prefix from disk, else start cold; prefill only
the rest (in the engine's aligned chunks, with progress and cancellation), split
where the policy wants a cold or continued checkpoint; stream the reply as whole
characters until EOS, a stop string, the token limit or a cancel, checkpointing
it where it reaches a continued frontier.

Leaves to others: where the prompt starts from (prefix_search.py), which sessions stay
in memory (pool.py), file formats and the budget (checkpoints.py over ds4tui.cache), the
math (ds4tui.engine).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ds4tui.cache.policy import CachePolicy
from ds4tui.chat.checkpoints import Checkpoints
from ds4tui.chat.conversation import Conversation
from ds4tui.chat.events import (
    CacheReport, Cancelled, ChatEvent, Done, PrefillProgress, PrefillStarted, TokenText,
)
from ds4tui.chat.pool import SessionPool
from ds4tui.chat.settings import Settings
from ds4tui.chat.prefix_search import PrefixSearch, token_text
from ds4tui.chat.sharing import anchor_tokens
from ds4tui.chat.streaming import ReplyStream
from ds4tui.engine.errors import ContextFullError
from ds4tui.engine.model import Model
from ds4tui.engine.sampling import Sampler, SamplingParams
from ds4tui.engine.session import Session

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


def render_prompt(chat, messages: Sequence[dict], now, tools: Sequence[dict] = ()) -> str:
    """The turn's prompt: the messages through the chat template, with the tools when there are
    any (only templates that render tools take them: JinjaChatTemplate)."""
    if tools:
        return chat.render(messages, add_generation_prompt=True, now=now, tools=list(tools))
    return chat.render(messages, add_generation_prompt=True, now=now)


class TurnPipeline:
    def __init__(self, model: Model, settings: Settings, pool: SessionPool, checkpoints: Checkpoints | None,
                 policy: CachePolicy, stop: threading.Event) -> None:
        self.model = model
        self.settings = settings
        self.pool = pool
        self.checkpoints = checkpoints
        self.policy = policy
        self._stop = stop  # set by the controller's cancel(), from any thread
        self.search = PrefixSearch(model, pool, checkpoints, policy)

    def run(self, conv: Conversation, on_event: EventFn, options: TurnOptions | None = None, *,
            seed_offset: int = 0, regenerated: bool = False) -> Done | None:
        """Generate the reply to conv's messages. None when cancelled during the prefill."""
        options = options or TurnOptions()
        cancel = options.cancel or self._stop
        t0 = time.perf_counter()
        prompt = options.prompt if options.prompt is not None else render_prompt(
            self.model.chat, conv.messages, conv.template_now, options.tools)
        prompt_bytes = prompt.encode("utf-8")
        found = self.search.prepare(conv, prompt, prompt_bytes, on_event)
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
        return token_text(self.model.tokenizer, tokens)

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
