"""The chat controller: conversations -> engine sessions -> disk checkpoints, headless.

Owns the life of a turn: render the messages with the model's chat template,
reuse the conversation's live session when it covers a prefix of the new
prompt, else restore the longest cached prefix from disk, else start cold;
prefill only the rest (in the engine's aligned chunks, with progress and
cancellation), split where the policy wants a cold or continued checkpoint;
stream the reply as whole characters until EOS, a stop string, the token limit
or a cancel; then save the conversation as a titled session. Also owns the
live-session cap (least recently used goes to disk with reason `evict`) and
the `shutdown` saves.

Leaves to others: file formats and the budget (ds4tui.cache, through
chat/checkpoints.py), the math (ds4tui.engine), and everything on screen.
It never imports textual or rich: a test checks.

Threading: `send`, `resume` and `shutdown` block and are meant for one worker
thread at a time; `cancel` may be called from any thread. Events go to the
`on_event` callback of each call, on the worker's thread.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import replace
from typing import Callable, Sequence

from ds4tui.cache.events import Miss
from ds4tui.cache.policy import CachePolicy
from ds4tui.chat.checkpoints import Checkpoints, SavedSession
from ds4tui.chat.conversation import Conversation, default_title
from ds4tui.chat.events import (
    Cancelled, ChatError, ChatEvent, Done, PrefillProgress, PrefillStarted, SessionFreed, TokenText,
)
from ds4tui.chat.streaming import ReplyStream
from ds4tui.config import Config
from ds4tui.engine.errors import EngineError
from ds4tui.engine.model import Model
from ds4tui.engine.sampling import Sampler, SamplingParams
from ds4tui.engine.session import Session

EventFn = Callable[[ChatEvent], None]


def _ignore(_: ChatEvent) -> None:
    pass


class ChatController:
    """Every open conversation of one model, and the disk cache they share."""

    def __init__(self, model: Model, config: Config | None = None, *, policy: CachePolicy | None = None) -> None:
        self.model = model
        self.config = config or Config()
        self.policy = policy or CachePolicy(budget_mb=self.config.budget_mb)
        self.checkpoints: Checkpoints | None = None
        if not self.config.no_disk_cache:
            self.checkpoints = Checkpoints(model, self.config.cache_path(), self.policy, ctx_size=self.config.ctx)
        self.conversations: dict[str, Conversation] = {}
        self._keys = itertools.count(1)
        self._lock = threading.Lock()  # guards `conversations` against UI-thread reads during a turn
        self._stop = threading.Event()
        self._ctx_size: int | None = None

    # -- conversations ------------------------------------------------------------------------

    def new_conversation(self, system_prompt: str | None = None) -> Conversation:
        """An empty chat; the system prompt (argument, else config) is fixed for its lifetime."""
        prompt = system_prompt if system_prompt is not None else self.config.system_prompt
        conv = Conversation(key=f"c{next(self._keys)}")
        if prompt:
            conv.messages.append({"role": "system", "content": prompt})
        with self._lock:
            self.conversations[conv.key] = conv
        return conv

    def get(self, key: str) -> Conversation:
        return self.conversations[key]

    def list(self) -> list[Conversation]:
        with self._lock:
            return list(self.conversations.values())

    def ctx_size(self) -> int:
        """Context size of this controller's sessions (the engine's default unless config.ctx is set)."""
        if self._ctx_size is None:
            live = next((c.session for c in self.list() if c.session is not None), None)
            if live is None:
                # The engine picks its default (memory-friendly, below n_ctx); ask it once
                # with a throwaway session rather than guess. Call off the UI thread.
                live = self.model.new_session(self.config.ctx)
            self._ctx_size = live.ctx_size
        return self._ctx_size

    def warm_up(self) -> None:
        """Pay the engine's first-use costs for sessions of ctx_size() now, off the UI thread
        (the app's model-loading worker): see Model.warm_up. Changes no result."""
        self.model.warm_up(self.ctx_size())

    def live_count(self) -> int:
        return sum(1 for c in self.list() if c.live)

    def saved_sessions(self) -> list[SavedSession]:
        """Titled sessions on disk that this model can load and that are not open already."""
        if self.checkpoints is None:
            return []
        open_shas = {c.saved_sha for c in self.list() if c.saved_sha}
        return [s for s in self.checkpoints.titled_sessions() if s.sha not in open_shas]

    def find_saved(self, query: str) -> list[SavedSession]:
        """Titled sessions whose file name starts with `query` or whose title equals it."""
        if self.checkpoints is None:
            return []
        return self.checkpoints.find_titled(query)

    def rename(self, key: str, title: str, on_event: EventFn = _ignore) -> None:
        """Give a chat a new title; its titled file (if any) moves to the new name."""
        title = " ".join(title.split())
        if not title:
            raise ValueError("a title must not be empty")
        conv = self.get(key)
        conv.title = title
        if conv.saved_sha and self.checkpoints is not None and not conv.busy:
            new_sha = self.checkpoints.retitle(conv.saved_sha, title, conv.created_at, on_event)
            if new_sha is not None:
                conv.saved_sha = new_sha

    def close(self, key: str, on_event: EventFn = _ignore) -> None:
        """Forget a chat in memory (its titled file stays); the session is saved first (`evict`)."""
        conv = self.get(key)
        if conv.live:
            self._free(conv, "evict", on_event)
        with self._lock:
            del self.conversations[key]

    # -- sampling -------------------------------------------------------------------------------

    def sampling_params(self) -> SamplingParams:
        c = self.config
        return SamplingParams(temperature=c.temperature, top_p=c.top_p, min_p=c.min_p, seed=c.seed)

    def update_config(self, **changes) -> None:
        """Settings the UI may change while running (sampling, max tokens, system prompt of new
        chats, the SWA policy of the next DSV4 checkpoints)."""
        self.config = replace(self.config, **changes)
        if "swa_policy" in changes:
            for conv in self.list():
                if conv.session is not None and not conv.busy:  # a busy one picks it up next turn
                    conv.session.set_storage_policy(self.config.swa_policy)

    # -- a turn ------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Ask the running turn to stop at the next chunk or token (any thread)."""
        self._stop.set()

    def send(self, key: str, text: str, on_event: EventFn = _ignore) -> Done | None:
        """Add a user message and generate the reply. Returns Done, or None when cancelled in
        prefill or failed (both reported through on_event; the user message is then withdrawn)."""
        conv = self.get(key)
        if conv.busy:
            raise RuntimeError(f"conversation {key} is already generating")
        self._stop.clear()
        conv.busy = True
        conv.touch()
        conv.messages.append({"role": "user", "content": text})
        if conv.title is None:
            conv.title = default_title(text)
        try:
            done = self._turn(conv, on_event)
        except EngineError as exc:
            on_event(ChatError("generate", str(exc)))
            done = None
        except Exception as exc:  # a bug must not take the app down; the session may be torn
            on_event(ChatError("generate", f"{type(exc).__name__}: {exc}"))
            conv.session, conv.session_text = None, b""
            done = None
        finally:
            conv.busy = False
        if done is None and conv.messages and conv.messages[-1].get("role") == "user":
            conv.messages.pop()
        if done is not None:
            self._save_titled(conv, on_event)
        return done

    def _turn(self, conv: Conversation, on_event: EventFn) -> Done | None:
        t0 = time.perf_counter()
        chat, tok = self.model.chat, self.model.tokenizer
        prompt = chat.render(conv.messages, add_generation_prompt=True)
        prompt_bytes = prompt.encode("utf-8")
        suffix, source = self._prepare(conv, prompt, prompt_bytes, on_event)
        session = conv.session
        assert session is not None
        session.set_storage_policy(self.config.swa_policy)  # a change made while this chat was busy
        base, base_text = len(session.tokens), conv.session_text
        on_event(PrefillStarted(total=len(suffix), cached=base, source=source))
        if not self._prefill(conv, suffix, source, on_event):
            on_event(Cancelled(prefilled=len(session.tokens) - base))
            return None
        # The session now holds the prompt: its old tokens plus the suffix.
        conv.session_text = base_text + self._text_of(suffix)
        prefill_s = time.perf_counter() - t0
        return self._generate(conv, on_event, t0, len(suffix), prefill_s)

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
        session = self._ensure_session(conv, on_event)
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

    def _prefill(self, conv: Conversation, suffix: Sequence[int], source: str, on_event: EventFn) -> bool:
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
            if seg and not session.prefill(seg, on_progress=progress, should_stop=self._stop.is_set):
                conv.session_text = base_text + self._text_of(session.tokens[base:])
                return False
            offset = at - base
            if reason is not None and self.checkpoints is not None:
                conv.session_text = base_text + self._text_of(session.tokens[base:])
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

    def _generate(self, conv: Conversation, on_event: EventFn, t0: float,
                  prompt_tokens: int, prefill_s: float) -> Done:
        session = conv.session
        assert session is not None and session.logits is not None
        tok = self.model.tokenizer
        sampler = Sampler(self.sampling_params())
        stream = ReplyStream(self.model.chat.stop_strings)
        eos = tok.eos_ids
        logits = session.logits
        text = bytearray(conv.session_text)
        generated, stop, ttft = 0, "max-tokens", None
        started = time.perf_counter()
        while generated < self.config.max_tokens:
            if self._stop.is_set():
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

    # -- sessions in memory -------------------------------------------------------------------

    def _ensure_session(self, conv: Conversation, on_event: EventFn) -> Session:
        """conv's session, creating it; over the live cap the least recently used other one goes to disk."""
        if conv.session is None:
            others = sorted((c for c in self.list() if c.live and c is not conv and not c.busy),
                            key=lambda c: c.last_active)
            while others and self.live_count() >= self.config.live_sessions:
                self._free(others.pop(0), "evict", on_event)
            conv.session = self.model.new_session(self.config.ctx)
            conv.session.set_storage_policy(self.config.swa_policy)  # False (ignored) without SWA layers
            conv.session_text = b""
        return conv.session

    def _free(self, conv: Conversation, reason: str, on_event: EventFn) -> None:
        """Save a live session (reason evict/shutdown) and drop it from memory."""
        session = conv.session
        if session is None:
            return
        if session.tokens and self.checkpoints is not None:
            self.checkpoints.save(session, conv.session_text, reason, on_event)
        conv.session, conv.session_text, conv.stored_upto = None, b"", 0
        on_event(SessionFreed(conversation=conv.key, reason=reason))

    def _text_of(self, tokens: Sequence[int]) -> bytes:
        """The exact bytes `tokens` stand for (the text a checkpoint of them stores)."""
        tb = self.model.tokenizer.token_bytes
        return b"".join(tb(t) for t in tokens)

    # -- titled sessions -----------------------------------------------------------------------

    def _save_titled(self, conv: Conversation, on_event: EventFn) -> None:
        if self.checkpoints is None or conv.session is None or not conv.session.tokens:
            return
        sha = self.checkpoints.save(conv.session, conv.session_text, "agent-session", on_event,
                                    title=conv.display_title, created_at=conv.created_at)
        if sha:
            if conv.saved_sha and conv.saved_sha != sha:
                self.checkpoints.delete(conv.saved_sha)
            conv.saved_sha = sha

    def resume(self, query: str, on_event: EventFn = _ignore) -> Conversation:
        """Open a titled session (file-name prefix or exact title): transcript and KV, no prefill.

        Raises LookupError when nothing (or more than one file) matches, EngineError
        when the file cannot be restored into this model.
        """
        if self.checkpoints is None:
            raise LookupError("the disk cache is off (--no-disk-cache): nothing to resume")
        for conv in self.list():
            if conv.saved_sha and (conv.saved_sha.startswith(query.lower()) or conv.title == query):
                conv.touch()
                return conv  # already open
        matches = self.checkpoints.find_titled(query)
        if not matches:
            raise LookupError(f"no saved session matches {query!r} (see `ds4tui kv ls`)")
        if len(matches) > 1:
            names = ", ".join(f"{m.sha[:12]} {m.title!r}" for m in matches[:5])
            raise LookupError(f"{query!r} matches {len(matches)} saved sessions: {names}")
        return self._open(matches[0], on_event)

    def open_file(self, sha: str, on_event: EventFn = _ignore) -> Conversation:
        """Open any checkpoint this model wrote (the cache browser's resume), titled or not.

        An untitled checkpoint is a prompt prefix: its transcript may end inside a
        message, and its next turn continues from exactly that KV state.
        """
        if self.checkpoints is None:
            raise LookupError("the disk cache is off (--no-disk-cache): nothing to resume")
        for conv in self.list():
            if conv.saved_sha == sha:
                conv.touch()
                return conv
        return self._open(self.checkpoints.describe(sha), on_event)

    def _open(self, saved: SavedSession, on_event: EventFn) -> Conversation:
        assert self.checkpoints is not None
        conv = Conversation(key=f"c{next(self._keys)}", title=saved.title, created_at=saved.created_at)
        conv.busy = True
        try:
            session = self._ensure_session(conv, on_event)
            text = self.checkpoints.load_saved(saved, session, on_event)
            try:
                conv.messages = self.model.chat.parse(text.decode("utf-8", errors="replace"))
            except ValueError as exc:
                raise EngineError(f"{saved.sha[:12]}: the text is not a transcript of this chat template ({exc})") from None
            conv.session_text = text
            conv.saved_sha = saved.sha if saved.titled else None
            conv.stored_upto = len(session.tokens)
            if conv.title is None:
                first = next((m["content"] for m in conv.messages if m.get("role") == "user"), "")
                conv.title = default_title(first) if first else f"checkpoint {saved.sha[:12]}"
        except BaseException:
            conv.session = None
            raise
        finally:
            conv.busy = False
        with self._lock:
            self.conversations[conv.key] = conv
        return conv

    def shutdown(self, on_event: EventFn = _ignore) -> None:
        """Save every live session (reason `shutdown`) and free them; the controller stays usable."""
        self._stop.set()
        for conv in self.list():
            if conv.live and not conv.busy:
                self._free(conv, "shutdown", on_event)


def _decode_suffix(prompt_bytes: bytes, start: int) -> str | None:
    """The prompt's text after `start` bytes, or None when `start` splits a UTF-8 character."""
    try:
        return prompt_bytes[start:].decode("utf-8")
    except UnicodeDecodeError:
        return None
