"""The chat against a remote OpenAI-compatible server (`ds4tui --engine URL`).

The same public interface as `ChatController`, so the chat screen drives either
one: conversations, send (streamed, with the same events), cancel, titles,
saved sessions, resume. What differs underneath:
- the model runs on the server: every turn sends the whole conversation and the
  server's own prefix cache makes the resend cheap (`ds4tui serve`, llama-server,
  vLLM and SGLang all keep one);
- history is kept here as transcripts (chat/transcripts.py), listed and resumed
  like titled sessions; there is no local KV cache (`cache_store` is None);
- cancel closes the HTTP stream, which every server takes as "stop generating";
- a failure (connection refused, 401, 429, a stream that drops) is one ChatError
  line and the user message is withdrawn, so the screen puts the text back.

Threading as ChatController: `send`/`resume` block in one worker thread; `cancel`
may come from any thread.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable

import httpx

from ds4tui import paths
from ds4tui.chat.checkpoints import SavedSession
from ds4tui.chat.conversation import MAX_TITLE_CHARS, Conversation, default_title
from ds4tui.chat.events import Cancelled, ChatError, ChatEvent, Done, Waiting
from ds4tui.chat.registry import Conversations, OpenChats
from ds4tui.chat.remote_stream import ReplyReader, RemoteError, sse_data
from ds4tui.chat.settings import Settings
from ds4tui.chat.transcripts import Transcript, Transcripts
from ds4tui.config import Config
from ds4tui.engine.sampling import SamplingParams

EventFn = Callable[[ChatEvent], None]
CONNECT_S = 10.0
READ_S = 600.0  # a long prompt on a slow server may take minutes before its first byte
WAITING_TICK_S = 0.5  # how often the "waiting for the server" line updates


def _ignore(_: ChatEvent) -> None:
    pass


class RemoteConversation(Conversation):
    """A conversation whose tokens live on a server: its size is what the server last reported."""

    remote_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        return self.remote_tokens


class RemoteChatController(OpenChats):
    conversation_kind = RemoteConversation

    def __init__(self, endpoint: str, config: Config | None = None, *, api_key: str | None = None,
                 model: str | None = None, transcripts_dir: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.settings = Settings(config)
        self.conversations = Conversations()
        self.transcripts = Transcripts(transcripts_dir or paths.transcripts_dir())
        self._model_id = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(headers=headers, transport=transport,
                                  timeout=httpx.Timeout(READ_S, connect=CONNECT_S))
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self.disk_cache_notice: str | None = None  # the KV cache is the server's own
        self.history_notice: str | None = None
        self._response: httpx.Response | None = None

    # -- what the screen shows ----------------------------------------------------------------

    @property
    def config(self) -> Config:
        return self.settings.config

    @property
    def model_name(self) -> str:
        host = httpx.URL(self.endpoint).host
        return f"{self._model_id or 'remote'} @ {host}"

    @property
    def model_info(self):
        return None  # no local model: the cache browser marks nothing as resumable

    def model_description(self) -> str:
        return f"{self._model_id or 'the server default model'} on the OpenAI-compatible server {self.endpoint}"

    @property
    def cache_store(self):
        return None

    def ctx_size(self) -> int:
        return 0  # the server's; OpenAI's API does not say it

    def warm_up(self) -> None:
        pass

    def live_count(self) -> int:
        return 0

    # -- conversations ------------------------------------------------------------------------

    # new_conversation, get, find, list: OpenChats (registry.py), opening RemoteConversations

    def saved_sessions(self, with_problems: bool = False) -> list[SavedSession]:
        """Remote chats kept here as transcripts (a transcript has no state that can break)."""
        open_names = {c.saved_sha for c in self.conversations.all() if c.saved_sha}
        return [s for s in self.transcripts.listing() if s.sha not in open_names]

    def find_saved(self, query: str) -> list[SavedSession]:
        return self.transcripts.find(query)

    # The chat screen lists stored chats; until remote chats move into the conversation store,
    # their transcripts are shown as such rows (the id is the transcript's name).

    def import_existing(self):
        from ds4tui.chat.history_import import ImportReport

        return ImportReport()

    def stored_chats(self, archived: bool = False) -> list:
        from ds4tui.store import StoredChat

        if archived:
            return []
        return [StoredChat(id=s.sha, title=s.title, model=self._model_id or "", engine=self.endpoint,
                           system_prompt=None, settings={}, created_at=s.created_at, updated_at=s.last_used,
                           kv_sha=None, kv_tokens=0, forked_from=None, archived=False)
                for s in self.saved_sessions()]

    def kv_on_disk(self, chat) -> bool:
        return True  # the server holds what it holds; nothing to re-prefill here

    def open_stored(self, chat_id: str, on_event: EventFn = _ignore) -> Conversation:
        return self.resume(chat_id, on_event)

    def rename(self, key: str, title: str, on_event: EventFn = _ignore) -> None:
        title = " ".join(title.split())
        if not title:
            raise ValueError("a title must not be empty")
        conv = self.get(key)
        conv.title = default_title(title, MAX_TITLE_CHARS) if len(title) > MAX_TITLE_CHARS else title
        if conv.saved_sha:
            self._save(conv, on_event)

    def close(self, key: str, on_event: EventFn = _ignore) -> None:
        self.conversations.remove(key)

    def sampling_params(self) -> SamplingParams:
        return self.settings.sampling_params()

    def update_config(self, **changes) -> None:
        self.settings.update(**changes)

    # -- a turn -------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Close the running stream (any thread); the server stops generating."""
        self._cancel.set()
        with self._lock:
            response = self._response
        if response is not None:
            response.close()

    def send(self, key: str, text: str, on_event: EventFn = _ignore) -> Done | None:
        conv = self.get(key)
        if conv.busy:
            raise RuntimeError(f"conversation {key} is already generating")
        self._cancel.clear()
        conv.busy = True
        conv.touch()
        conv.messages.append({"role": "user", "content": text})
        if conv.title is None:
            conv.title = default_title(text)
        try:
            done = self._turn(conv, on_event)
        except RemoteError as exc:
            on_event(ChatError("remote", str(exc)))
            done = None
        except Exception as exc:  # a bug must not take the app down
            on_event(ChatError("remote", f"{type(exc).__name__}: {exc}"))
            done = None
        finally:
            conv.busy = False
        if done is None and conv.messages and conv.messages[-1].get("role") == "user":
            conv.messages.pop()
        if done is not None:
            self._save(conv, on_event)
        return done

    def _turn(self, conv: Conversation, on_event: EventFn) -> Done | None:
        body = self._body(conv.messages)
        started = time.perf_counter()
        reader = ReplyReader(on_event, started)
        ticker = _WaitingTicker(on_event, started)
        finished = False
        try:
            with self._http.stream("POST", f"{self.endpoint}/chat/completions", json=body) as response:
                with self._lock:
                    self._response = response
                if self._cancel.is_set():
                    response.close()
                if response.status_code != 200:
                    response.read()
                    raise RemoteError(describe_status(response, self.endpoint))
                for data in sse_data(response.iter_lines()):
                    if data.strip() == "[DONE]":
                        finished = True
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise RemoteError("the server sent an event that is not JSON") from None
                    if ticker.running and _has_signal(chunk):
                        ticker.stop()  # joined before the reader emits: one thread sends events
                    reader.feed(chunk)
                finished = finished or reader.finish is not None
        except (httpx.HTTPError, httpx.StreamError) as exc:
            if not self._cancel.is_set():
                raise RemoteError(describe_transport(exc, self.endpoint, reader.tokens)) from None
        except Exception:
            if not self._cancel.is_set():  # closing a stream mid-read may surface as anything
                raise
        finally:
            ticker.stop()
            with self._lock:
                self._response = None
        if self._cancel.is_set() and not finished:
            if not reader.tokens:
                on_event(Cancelled(prefilled=0))
                return None
            return self._finish(conv, reader, on_event, cancelled=True)
        if not finished:
            raise RemoteError(f"the stream dropped after {reader.tokens} token(s) without an end")
        return self._finish(conv, reader, on_event, cancelled=False)

    def _finish(self, conv: Conversation, reader: ReplyReader, on_event: EventFn, cancelled: bool) -> Done:
        done = reader.done(cancelled=cancelled)
        conv.messages.append({"role": "assistant", "content": reader.text})
        if isinstance(conv, RemoteConversation):
            conv.remote_tokens = done.context_tokens
        on_event(done)
        return done

    def _body(self, messages: list[dict]) -> dict:
        c = self.config
        body = {
            "model": self._model(),
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": c.max_tokens,
            "temperature": c.temperature,
            "top_p": c.top_p,
            "return_progress": True,  # llama-server's prefill progress; other servers ignore it
        }
        if c.min_p > 0:
            body["min_p"] = c.min_p  # vLLM, SGLang, llama-server and ds4tui serve take it
        if c.seed is not None:
            body["seed"] = c.seed
        return body

    def _model(self) -> str:
        """--remote-model, else the first model the server lists (asked once)."""
        if self._model_id is None:
            try:
                r = self._http.get(f"{self.endpoint}/models", timeout=CONNECT_S)
            except httpx.HTTPError as exc:
                raise RemoteError(describe_transport(exc, self.endpoint, 0)) from None
            if r.status_code != 200:
                raise RemoteError(describe_status(r, self.endpoint))
            try:
                self._model_id = str(r.json()["data"][0]["id"])
            except (ValueError, KeyError, IndexError, TypeError):
                raise RemoteError(f"{self.endpoint}/models lists no model: pass --remote-model NAME") from None
        return self._model_id

    # -- transcripts --------------------------------------------------------------------------

    def _save(self, conv: Conversation, on_event: EventFn) -> None:
        conv.saved_sha = conv.saved_sha or self.transcripts.new_name()
        try:
            self.transcripts.save(Transcript(sha=conv.saved_sha, title=conv.display_title, created_at=conv.created_at,
                                             messages=conv.messages, engine=self.endpoint, model=self._model_id or ""))
        except OSError as exc:
            on_event(ChatError("save", f"transcript not saved: {exc}"))

    def resume(self, query: str, on_event: EventFn = _ignore) -> Conversation:
        """Open a transcript by name prefix or title; LookupError when none or several match."""
        for conv in self.conversations.all():
            if conv.saved_sha and (conv.saved_sha.startswith(query.lower()) or conv.title == query):
                conv.touch()
                return conv
        matches = self.transcripts.find(query)
        if not matches:
            raise LookupError(f"no saved conversation matches {query!r}")
        if len(matches) > 1:
            names = ", ".join(f"{m.sha[:12]} {m.title!r}" for m in matches[:5])
            raise LookupError(f"{query!r} matches {len(matches)} saved conversations: {names}")
        return self.open_file(matches[0].sha, on_event)

    def open_file(self, sha: str, on_event: EventFn = _ignore) -> Conversation:
        for conv in self.conversations.all():
            if conv.saved_sha == sha:
                conv.touch()
                return conv
        t = self.transcripts.load(sha)
        conv = RemoteConversation(key=self.conversations.new_key(), title=t.title, created_at=t.created_at,
                                  messages=list(t.messages), saved_sha=sha)
        return self.conversations.add(conv)

    def shutdown(self, on_event: EventFn = _ignore) -> None:
        """Stop what runs; transcripts are already saved after every reply."""
        self.cancel()


def _has_signal(chunk: object) -> bool:
    """Progress, text, an end or an error: anything after which elapsed time is not the news."""
    if not isinstance(chunk, dict):
        return True
    if "prompt_progress" in chunk or "error" in chunk:
        return True
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and (choice.get("finish_reason")
                                         or (isinstance(choice.get("delta"), dict) and choice["delta"].get("content"))):
            return True
    return False


class _WaitingTicker:
    """Emits Waiting(elapsed) every tick until stopped: the screen's clock while a server that
    sends no progress reads the prompt. Stopped (and joined) before the first real event."""

    def __init__(self, emit: EventFn, started: float) -> None:
        self._emit = emit
        self._started = started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ds4tui-waiting", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.wait(WAITING_TICK_S):
            self._emit(Waiting(elapsed_s=time.perf_counter() - self._started))

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()


def describe_status(response: httpx.Response, endpoint: str) -> str:
    """One line for a non-200 answer, with the server's own message when it sent one."""
    code = response.status_code
    try:
        err = response.json().get("error")
        detail = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        detail = None
    detail = f": {str(detail)[:200]}" if detail else ""
    if code in (401, 403):
        return f"the server refused the API key (HTTP {code}){detail}. Set it with --api-key-env VAR"
    if code == 429:
        wait = response.headers.get("retry-after")
        return f"the server is busy (HTTP 429){detail}" + (f"; retry in {wait} s" if wait else "; retry later")
    if code == 404:
        return f"{endpoint} has no such route (HTTP 404){detail}. --engine should end in /v1"
    return f"the server answered HTTP {code}{detail}"


def describe_transport(exc: Exception, endpoint: str, tokens: int) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {endpoint}: connection refused or no route (is the server running?)"
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot connect to {endpoint}: timed out"
    if isinstance(exc, httpx.ReadTimeout):
        return f"the server sent nothing for {READ_S:.0f} s"
    return f"the stream dropped after {tokens} token(s) ({type(exc).__name__})"
