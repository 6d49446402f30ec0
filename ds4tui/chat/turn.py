"""One turn of a chat, headless: prompt -> longest cached prefix -> prefill the rest -> stream.

Owns the pipeline of a turn: render the messages with the model's chat template,
reuse the conversation's live session when it covers a prefix of the new prompt,
else restore the longest cached prefix from disk, else start cold; prefill only
the rest (in the engine's aligned chunks, with progress and cancellation), split
where the policy wants a cold or continued checkpoint; stream the reply as whole
characters until EOS, a stop string, the token limit or a cancel.

Leaves to others: which sessions stay in memory (pool.py), file formats and the
budget (checkpoints.py over ds4tui.cache), the math (ds4tui.engine).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ds4tui.cache.events import Miss
from ds4tui.cache.policy import CachePolicy
from ds4tui.chat.checkpoints import Checkpoints
from ds4tui.chat.conversation import Conversation
from ds4tui.chat.events import Cancelled, ChatEvent, Done, PrefillProgress, PrefillStarted, TokenText
from ds4tui.chat.pool import SessionPool
from ds4tui.chat.settings import Settings
from ds4tui.chat.streaming import ReplyStream
from ds4tui.engine.errors import ContextFullError
from ds4tui.engine.model import Model
from ds4tui.engine.sampling import Sampler, SamplingParams

EventFn = Callable[[ChatEvent], None]


@dataclass(frozen=True)
class TurnOptions:
    """What one turn may set for itself instead of the chat's settings (the server sets them
    per request). None / empty: the settings' value, the template's stop strings only."""

    sampling: SamplingParams | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()  # stop strings on top of the chat template's own
    cancel: threading.Event | None = None  # this turn's own cancel flag (default: the controller's)


class TurnPipeline:
    def __init__(self, model: Model, settings: Settings, pool: SessionPool, checkpoints: Checkpoints | None,
                 policy: CachePolicy, stop: threading.Event) -> None:
        self.model = model
        self.settings = settings
        self.pool = pool
        self.checkpoints = checkpoints
        self.policy = policy
        self._stop = stop  # set by the controller's cancel(), from any thread

    def run(self, conv: Conversation, on_event: EventFn, options: TurnOptions | None = None) -> Done | None:
        """Generate the reply to conv's messages. None when cancelled during the prefill."""
        options = options or TurnOptions()
        cancel = options.cancel or self._stop
        t0 = time.perf_counter()
        prompt = self.model.chat.render(conv.messages, add_generation_prompt=True)
        prompt_bytes = prompt.encode("utf-8")
        suffix, source = self._prepare(conv, prompt, prompt_bytes, on_event)
        session = conv.session
        assert session is not None
        session.set_storage_policy(self.settings.config.swa_policy)  # a change made while this chat was busy
        base, base_text = len(session.tokens), conv.session_text
        if base + len(suffix) > session.ctx_size:  # refuse now, not after prefilling what fits
            raise ContextFullError(f"context full: the prompt needs {base + len(suffix)} tokens,"
                                   f" the context holds {session.ctx_size}")
        on_event(PrefillStarted(total=len(suffix), cached=base, source=source))
        if not self._prefill(conv, suffix, source, on_event, cancel):
            on_event(Cancelled(prefilled=len(session.tokens) - base))
            return None
        # The session now holds the prompt: its old tokens plus the suffix.
        conv.session_text = base_text + self.text_of(suffix)
        prefill_s = time.perf_counter() - t0
        return self._generate(conv, on_event, t0, len(suffix), prefill_s, options, cancel)

    def text_of(self, tokens: Sequence[int]) -> bytes:
        """The exact bytes `tokens` stand for (the text a checkpoint of them stores)."""
        tb = self.model.tokenizer.token_bytes
        return b"".join(tb(t) for t in tokens)

    def _prepare(self, conv: Conversation, prompt: str, prompt_bytes: bytes,
                 on_event: EventFn) -> tuple[list[int], str]:
        """Make conv.session cover the longest known prefix; return the tokens still to prefill.

        Afterwards conv.session_text is the exact text of the session's tokens.
        """
        tok = self.model.tokenizer
        session = conv.session
        if session is not None and session.tokens:
            full = tok.encode(prompt)
            n = len(session.tokens)
            if full[:n] == session.tokens:
                # Same tokens as a cold prefill would use: the answer is bit-identical.
                return full[n:], "live"
            # The reply's sampled tokens need not match a re-tokenization of its text;
            # the session's own tokens stay authoritative and only the new text is
            # encoded. Compared as decoded text: a reply holding invalid UTF-8 is kept
            # in the transcript with U+FFFD, exactly as this decode shows it.
            have = conv.session_text.decode("utf-8", errors="replace")
            if prompt.startswith(have):
                return tok.encode(prompt[len(have):]), "live"
        session = self.pool.ensure(conv, on_event)
        if self.checkpoints is not None:
            covered = self.checkpoints.restore_longest(prompt_bytes, session, on_event)
            if covered:
                rest = _decode_suffix(prompt_bytes, covered)
                if rest is not None:
                    conv.session_text = prompt_bytes[:covered]
                    conv.stored_upto = len(session.tokens)
                    return tok.encode(rest), "disk"
        else:
            on_event(Miss("disk cache off (--no-disk-cache)"))
        session.reset()
        conv.session_text = b""
        conv.stored_upto = 0
        return tok.encode(prompt), "cold"

    def _prefill(self, conv: Conversation, suffix: Sequence[int], source: str, on_event: EventFn,
                 cancel: threading.Event) -> bool:
        """Prefill `suffix`, pausing at checkpoint points; False when cancelled (state stays consistent)."""
        session = conv.session
        assert session is not None
        base, base_text = len(session.tokens), conv.session_text
        end = base + len(suffix)
        stops = self._checkpoint_points(conv, base, end, cold=(source == "cold"))
        total = len(suffix)
        started = time.perf_counter()
        offset = 0

        def progress(done: int, _total: int) -> None:
            done += offset
            elapsed = time.perf_counter() - started
            rate = done / elapsed if elapsed > 0 else 0.0
            eta = (total - done) / rate if rate > 0 else None
            on_event(PrefillProgress(done=done, total=total, tok_s=rate, eta_s=eta))

        for at, reason in stops + [(end, None)]:
            seg = suffix[offset : at - base]
            if seg and not session.prefill(seg, on_progress=progress, should_stop=cancel.is_set):
                conv.session_text = base_text + self.text_of(session.tokens[base:])
                return False
            offset = at - base
            if reason is not None and self.checkpoints is not None:
                conv.session_text = base_text + self.text_of(session.tokens[base:])
                if self.checkpoints.save(session, conv.session_text, reason, on_event):
                    conv.stored_upto = len(session.tokens)
        return True

    def _checkpoint_points(self, conv: Conversation, base: int, end: int, cold: bool) -> list[tuple[int, str]]:
        """Absolute token counts inside (base, end] where the policy wants a checkpoint."""
        if self.checkpoints is None:
            return []
        points: dict[int, str] = {}
        policy = self.policy
        if cold and base == 0 and policy.cold_allowed(end):
            n = policy.store_len(end)
            if n > 0:
                points[n] = "cold"
        frontier = policy.next_continued_frontier(max(conv.stored_upto, base))
        step = policy.continued_step
        while frontier and step and frontier <= end:
            if frontier > base:
                points.setdefault(frontier, "continued")
            frontier += step
        return sorted(points.items())

    def _generate(self, conv: Conversation, on_event: EventFn, t0: float, prompt_tokens: int,
                  prefill_s: float, options: TurnOptions, cancel: threading.Event) -> Done:
        session = conv.session
        assert session is not None and session.logits is not None
        tok = self.model.tokenizer
        sampler = Sampler(options.sampling or self.settings.sampling_params())
        stream = ReplyStream(tuple(self.model.chat.stop_strings) + options.stop)
        max_tokens = options.max_tokens or self.settings.config.max_tokens
        eos = tok.eos_ids
        logits = session.logits
        text = bytearray(conv.session_text)
        generated, stop, ttft = 0, "max-tokens", None
        started = time.perf_counter()
        while generated < max_tokens:
            if cancel.is_set():
                stop = "cancelled"
                break
            token = sampler(logits)
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
            logits = session.decode(token)
            text += piece
            generated += 1
            if stream.stopped:
                stop = "stop-string"
                break
        tail = stream.finish()
        if tail:
            on_event(TokenText(tail))
        conv.session_text = bytes(text)
        conv.messages.append({"role": "assistant", "content": stream.text})
        decode_s = time.perf_counter() - started
        done = Done(
            tokens=generated,
            tok_s=generated / decode_s if decode_s > 0 and generated else 0.0,
            prompt_tokens=prompt_tokens,
            prefill_tok_s=prompt_tokens / prefill_s if prefill_s > 0 else 0.0,
            ttft_ms=ttft if ttft is not None else prefill_s * 1000.0,
            context_tokens=len(session.tokens),
            stop=stop,
        )
        on_event(done)
        return done


def _decode_suffix(prompt_bytes: bytes, start: int) -> str | None:
    """The prompt's text after `start` bytes, or None when `start` splits a UTF-8 character."""
    try:
        return prompt_bytes[start:].decode("utf-8")
    except UnicodeDecodeError:
        return None
