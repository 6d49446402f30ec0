"""Reading an OpenAI-style streamed chat completion into the chat's events.

Owns: splitting server-sent events into their data payloads, and folding the
chunks of one reply into TokenText / PrefillStarted / PrefillProgress events
and a final `Done`. It understands what the servers the chat talks to send:
- every server: `choices[0].delta.content` and `finish_reason`, and with
  `stream_options.include_usage` a last chunk with `usage` (vLLM and SGLang add
  `usage.prompt_tokens_details.cached_tokens` when their prefix cache is on);
- llama-server (and `ds4tui serve`): `prompt_progress` {total, cache, processed}
  chunks while the prompt is read when asked with `return_progress`, and a
  `timings` object with `cache_n` (prompt tokens reused) and its own speeds;
- an `error` object in the stream (vLLM, llama-server) ends the reply with it.
No HTTP here: chat/remote.py owns the connection.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

from ds4tui.chat.events import (ChatEvent, Done, PrefillProgress, PrefillStarted, ReasoningText, TokenText,
                               ToolCallShown)
from ds4tui.errors import Ds4tuiError

EventFn = Callable[[ChatEvent], None]
STOPS = {"stop": "eos", "length": "max-tokens", "content_filter": "stop-string", "tool_calls": "eos"}


class RemoteError(Ds4tuiError):
    """One line the user can act on: what failed talking to the server."""


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The data payload of each server-sent event (multi-line data joined by newlines).
    Comments (`: ping`) and other fields (event, id, retry) carry nothing for us."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class ReplyReader:
    """Folds the chunks of one streamed reply into events; `done()` gives the final record."""

    def __init__(self, emit: EventFn, started: float) -> None:
        self.emit = emit
        self.started = started  # perf_counter() when the request was sent
        self.parts: list[str] = []
        self.tokens = 0  # content chunks seen (a token each on every server we know)
        self.finish: str | None = None
        self.usage: dict = {}
        self.timings: dict = {}
        self.first_text_at: float | None = None
        self.prefill_started = False
        self.progressed = False  # any sign of life besides text (progress)
        self.reasoning: list[str] = []  # `reasoning_content` deltas: shown folded, not sent back
        self._calls: dict[int, list[str]] = {}  # tool call index -> [name, arguments so far]

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, chunk: object) -> None:
        if not isinstance(chunk, dict):
            raise RemoteError("the server sent a chunk that is not a JSON object")
        if "error" in chunk:
            err = chunk["error"]
            message = err.get("message") if isinstance(err, dict) else err
            raise RemoteError(f"the server reported an error: {message}")
        progress = chunk.get("prompt_progress")
        if isinstance(progress, dict):
            self._progress(progress)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str) and content:
                if self.first_text_at is None:
                    self.first_text_at = time.perf_counter()
                self.parts.append(content)
                self.tokens += 1
                self.emit(TokenText(content))
            thought = delta.get("reasoning_content") if isinstance(delta, dict) else None
            if isinstance(thought, str) and thought:
                if self.first_text_at is None:
                    self.first_text_at = time.perf_counter()
                self.reasoning.append(thought)
                self.tokens += 1
                self.emit(ReasoningText(thought))
            self._call_deltas(delta.get("tool_calls") if isinstance(delta, dict) else None)
            if isinstance(choice.get("finish_reason"), str):
                self.finish = choice["finish_reason"]
                for name, arguments in self._calls.values():
                    self.emit(ToolCallShown(name, arguments or "{}"))
                self._calls = {}

    def _call_deltas(self, calls: object) -> None:
        """OpenAI streams a call as pieces: its name first, its arguments' text in parts."""
        if not isinstance(calls, list):
            return
        for part in calls:
            if not isinstance(part, dict):
                continue
            index = part.get("index", len(self._calls))
            fn = part.get("function") if isinstance(part.get("function"), dict) else {}
            call = self._calls.setdefault(index if isinstance(index, int) else len(self._calls), ["", ""])
            if isinstance(fn.get("name"), str):
                call[0] += fn["name"]
            if isinstance(fn.get("arguments"), str):
                call[1] += fn["arguments"]

    def _progress(self, progress: dict) -> None:
        total, cache, processed = (_int(progress.get(k)) for k in ("total", "cache", "processed"))
        if total is None or processed is None:
            return
        cache = min(cache or 0, total)
        new_total, done = total - cache, max(0, min(processed, total) - cache)
        if not self.prefill_started:
            self.prefill_started = True
            self.emit(PrefillStarted(total=new_total, cached=cache, source="remote"))
        self.progressed = True
        elapsed = time.perf_counter() - self.started
        rate = done / elapsed if elapsed > 0 and done else 0.0
        eta = (new_total - done) / rate if rate > 0 else None
        self.emit(PrefillProgress(done=done, total=new_total, tok_s=rate, eta_s=eta))

    def cached_tokens(self) -> int | None:
        details = self.usage.get("prompt_tokens_details")
        if isinstance(details, dict) and _int(details.get("cached_tokens")) is not None:
            return details["cached_tokens"]
        return _int(self.timings.get("cache_n"))

    def done(self, cancelled: bool = False) -> Done:
        now = time.perf_counter()
        first = self.first_text_at or now
        completion = _int(self.usage.get("completion_tokens")) or _int(self.timings.get("predicted_n")) or self.tokens
        prompt = _int(self.usage.get("prompt_tokens"))
        cached = self.cached_tokens()
        if prompt is None and _int(self.timings.get("prompt_n")) is not None:
            prompt = self.timings["prompt_n"] + (cached or 0)  # llama.cpp counts only the new part
        prefilled = max(0, (prompt or 0) - (cached or 0))
        decode_s = now - first
        tok_s = self.timings.get("predicted_per_second")
        if not isinstance(tok_s, (int, float)):
            tok_s = (completion - 1) / decode_s if decode_s > 0 and completion > 1 else 0.0
        prefill_s = first - self.started
        prefill_rate = self.timings.get("prompt_per_second")
        if not isinstance(prefill_rate, (int, float)):
            prefill_rate = prefilled / prefill_s if prefill_s > 0 and prefilled else 0.0
        stop = "cancelled" if cancelled else STOPS.get(self.finish or "", "eos")
        return Done(tokens=completion, tok_s=float(tok_s), prompt_tokens=prefilled, prefill_tok_s=float(prefill_rate),
                    ttft_ms=(first - self.started) * 1000.0, context_tokens=(prompt or 0) + completion, stop=stop,
                    cached_tokens=cached)
