"""The chat against a remote OpenAI-compatible server (`ds4tui --engine URL`).

One of the two chat backends (chat/backend.py, `ChatBackend`): the chat screen drives it
as it drives the embedded `ChatController`, every move included. What differs underneath:
- the model runs on the server: every turn sends the whole conversation and the
  server's own prefix cache makes the resend cheap (`ds4tui serve`, llama-server,
  vLLM and SGLang all keep one); there is no local KV cache (`cache_store` is None);
- history lives in the same conversation store as the embedded chats' (chat/history.py,
  the engine recorded as this URL, the model as the server names it): a turn is
  committed before its reply and again when it ends; regenerate keeps the old reply as a
  version, an edit keeps the old continuation as a fork, a fork is a new stored chat;
- the moves are only message bookkeeping (chat/branches.py): the server re-reads what
  its cache does not hold;
- the context fit check uses the server's reported token counts, scaled to the next
  message, when the server says its context (`max_model_len` in /v1/models: vLLM,
  ds4tui serve); without one every message is sent and the server's refusal is the answer;
- cancel closes the HTTP stream, which every server takes as "stop generating";
- a failure (connection refused, 401, 429, a stream that drops) is one ChatError
  line and the user message is withdrawn, so the screen puts the text back.

Threading as ChatController: `send` and the moves block in one worker thread; `cancel`
may come from any thread, the listings and lookups from the UI thread.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import httpx

from ds4tui import paths
from ds4tui.chat import branches
from ds4tui.chat.conversation import MAX_TITLE_CHARS, Conversation, default_title
from ds4tui.chat.events import (Cancelled, ChatError, ChatEvent, ContextWontFit, Done, FitCheck, Forked,
                                HistoryOpened)
from ds4tui.chat.history import ChatHit, History
from ds4tui.chat.history_import import ImportReport, import_existing
from ds4tui.chat.registry import Conversations, OpenChats
from ds4tui.chat.remote_server import RemoteServer
from ds4tui.chat.remote_stream import ReplyReader, RemoteError
from ds4tui.chat.reply_view import ReplyFormat, ReplySplitter, ReplyView, view_of
from ds4tui.chat.settings import CHAT_KEYS, Settings
from ds4tui.config import Config
from ds4tui.engine.sampling import SamplingParams
from ds4tui.errors import error_line
from ds4tui.store import ConversationStore, StoredChat, StoreError, open_store

EventFn = Callable[[ChatEvent], None]
# Tokens a message must leave for its reply (as the embedded chat: moves.REPLY_RESERVE).
REPLY_RESERVE = 256


def _ignore(_: ChatEvent) -> None:
    pass


class RemoteConversation(Conversation):
    """A conversation whose tokens live on a server: its size is what the server last reported
    (kept in the store, so a chat opened again shows it before the server counts again)."""

    remote_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        return self.remote_tokens

    @property
    def stored_tokens(self) -> int:
        # A local chat continued here keeps its titled file's count: the file is still its cache.
        return self.saved_upto if self.saved_sha else self.remote_tokens


class RemoteChatController(OpenChats):
    conversation_kind = RemoteConversation

    def __init__(self, endpoint: str, config: Config | None = None, *, api_key: str | None = None,
                 model: str | None = None, store: ConversationStore | None = None,
                 transport: httpx.BaseTransport | None = None, models: list[dict] | None = None) -> None:
        """models: the server's /models entries when already asked (remote_probe.py, before the
        UI opens): the model to use and its context are known before the first message."""
        # The HTTP side (the model, its context, one streamed reply, cancel): chat/remote_server.py.
        self.server = RemoteServer(endpoint, api_key=api_key, model=model, transport=transport, models=models)
        self.settings = Settings(config)
        self.conversations = Conversations()
        # The record of every chat, shared with the embedded chat: this engine is the URL.
        self.history = History(store or open_store(paths.store_path(self.settings.config.data_dir)),
                               model_spec=self.server.model_id or "", engine=self.endpoint)
        self.disk_cache_notice: str | None = None  # the KV cache is the server's own

    # -- what the screen shows ----------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The server's /v1 base URL (the store records it as the chats' engine)."""
        return self.server.endpoint

    @property
    def config(self) -> Config:
        return self.settings.config

    @property
    def model_name(self) -> str:
        host = httpx.URL(self.endpoint).host
        return f"{self.server.model_id or 'remote'} @ {host}"

    @property
    def model_info(self):
        return None  # no local model: the cache browser marks nothing as resumable

    def model_description(self) -> str:
        return f"{self.server.model_id or 'the server default model'} on the OpenAI-compatible server {self.endpoint}"

    @property
    def cache_store(self):
        return None

    def ctx_size(self) -> int:
        """The server's context when its /v1/models said it (after the first turn), else 0."""
        return self.server.context or 0

    def has_sliding_window(self) -> bool:
        return False  # the server's sessions: no storage policy to set from here

    def warm_up(self) -> None:
        pass

    def live_count(self) -> int:
        return 0

    @property
    def history_notice(self) -> str | None:
        """Set when the store's file could not be used and chats are kept in memory only."""
        return self.history.notice

    # -- conversations ------------------------------------------------------------------------

    # new_conversation, get, find, list: OpenChats (registry.py), opening RemoteConversations

    def rename(self, key: str, title: str, on_event: EventFn = _ignore) -> None:
        title = " ".join(title.split())
        if not title:
            raise ValueError("a title must not be empty")
        conv = self.get(key)
        conv.title = default_title(title, MAX_TITLE_CHARS) if len(title) > MAX_TITLE_CHARS else title
        self.history.commit(conv, on_event)

    def close(self, key: str, on_event: EventFn = _ignore) -> None:
        self.conversations.remove(key)

    def sampling_params(self) -> SamplingParams:
        return self.settings.sampling_params()

    def update_config(self, **changes) -> None:
        self.settings.update(**changes)

    def reply_view(self, text: str) -> ReplyView:
        """A stored reply as the chat shows it. The server sent its reasoning apart (shown while
        it streamed, not kept); a `<think>` block left in the text is folded all the same."""
        return view_of(text)

    # import_messages, fresh_like: OpenChats (registry.py); an imported chat's next message sends it all.

    # -- per-chat settings -------------------------------------------------------------------------

    def set_chat_settings(self, key: str, **changes) -> None:
        """Change one chat's sampling (CHAT_KEYS, sent with each of its requests) and system
        prompt (its first message); new chats keep the config's defaults."""
        conv = self._idle(key)
        unknown = set(changes) - set(CHAT_KEYS) - {"system_prompt"}
        if unknown:
            raise ValueError(f"not a chat setting: {', '.join(sorted(unknown))}")
        if "system_prompt" in changes:
            branches.set_system_prompt(conv, changes.pop("system_prompt"))
        conv.overrides.update(changes)
        self.history.commit(conv)

    # -- a turn -------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Close the running stream (any thread); the server stops generating."""
        self.server.cancel()

    def send(self, key: str, text: str, on_event: EventFn = _ignore) -> Done | None:
        """Add a user message and stream the reply. Returns Done, or None when cancelled before
        a token or failed (the message is then withdrawn). A message the server's context
        cannot hold (check_fit) is not sent: a ContextWontFit event carries the choices."""
        conv = self._claim(key)
        try:
            check = self._fit(conv, text)
            if not check.fits:
                on_event(ContextWontFit(check))
                return None
            conv.messages.append({"role": "user", "content": text})
            untitled = conv.title is None
            if untitled:
                conv.title = default_title(text)
            done = self._turn(conv, on_event)
            if done is None and untitled:
                self._forget_unsent(conv)
            return done
        finally:
            conv.busy = False

    def _claim(self, key: str) -> Conversation:
        conv = self.get(key)
        if conv.busy:
            raise RuntimeError(f"conversation {key} is already generating")
        self.server.clear_cancel()
        conv.busy = True
        conv.touch()
        return conv

    def _turn(self, conv: Conversation, on_event: EventFn, withdraw: bool = True, regenerated: bool = False,
              seed_offset: int = 0) -> Done | None:
        """One request on conv's messages (they end with the user message), committed before
        (the message) and after (the reply, or as much of it as a cancel left)."""
        try:
            self.history.model_spec = self.server.model()  # the server's model names the chat in the store
            if conv.model_spec != self.history.model_spec:
                self.history.record_model(conv)  # a chat of another engine continues here
            self.history.commit(conv, on_event)  # a crash while it streams loses only the reply
            done = self._stream(conv, on_event, seed_offset)
        except Exception as exc:  # RemoteError: its one line; a bug must not take the app down
            on_event(ChatError("remote", error_line(exc)))
            done = None
        if done is not None and regenerated:
            done = dataclasses.replace(done, regenerated=True)
        if withdraw and done is None and conv.messages and conv.messages[-1].get("role") == "user":
            conv.messages.pop()
        self.history.commit(conv, on_event)
        return done

    def _stream(self, conv: Conversation, on_event: EventFn, seed_offset: int = 0) -> Done | None:
        body = self._body(conv, seed_offset)
        started = time.perf_counter()
        # A server that leaves a <think> block in the content (no reasoning parser of its own):
        # split here as the embedded chat does.
        on_event = ReplySplitter(on_event, ReplyFormat())
        reader = ReplyReader(on_event, started)
        finished = self.server.stream(body, reader, on_event, started)
        if self.server.cancelled and not finished:
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

    def _body(self, conv: Conversation, seed_offset: int = 0) -> dict:
        """The request: the whole history and this chat's sampling (its F3 settings, else the config's)."""
        value = lambda k: self.settings.value(k, conv)  # noqa: E731
        body = {
            "model": self.server.model(),
            "messages": conv.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": int(value("max_tokens")),
            "temperature": value("temperature"),
            "top_p": value("top_p"),
            "return_progress": True,  # llama-server's prefill progress; other servers ignore it
        }
        if value("min_p") > 0:
            body["min_p"] = value("min_p")  # vLLM, SGLang, llama-server and ds4tui serve take it
        if value("seed") is not None:
            body["seed"] = value("seed") + seed_offset  # a regenerate with a fixed seed still differs
        return body

    # -- the context ---------------------------------------------------------------------------------

    def check_fit(self, key: str, text: str) -> FitCheck:
        """Whether `text` as the next message fits the server's context with room for a reply,
        and the choices when not (see _fit)."""
        return self._fit(self.get(key), text)

    def _fit(self, conv: Conversation, text: str, upto: int | None = None) -> FitCheck:
        """The embedded chat's check on the server's numbers: the tokens it counted for this chat
        last time, per character, give each message's size (a tokenizer we do not have would
        give it exactly). With no context known or nothing counted yet, the message fits and
        the server is the judge."""
        ctx = self.ctx_size()
        counted = conv.remote_tokens if isinstance(conv, RemoteConversation) else 0
        sent = _chars(conv.messages)
        if not ctx or not counted or not sent:
            return FitCheck(True, 0, 0, ctx)
        per_char = counted / sent
        reserve = min(self.settings.max_tokens(conv), REPLY_RESERVE, max(1, ctx // 8))
        return branches.fit_check(list(conv.messages[:upto] if upto is not None else conv.messages), text,
                                  lambda ms: round(_chars(ms) * per_char), ctx, reserve)

    def drop_oldest(self, key: str, turns: int) -> None:
        """Drop the oldest `turns` user/assistant exchanges, keeping the system prompt (the
        caller's choice after check_fit); the next request sends what is left."""
        conv = self._idle(key)
        branches.drop_oldest(conv, turns)
        if isinstance(conv, RemoteConversation):
            conv.remote_tokens = 0  # what the server counted was the longer chat
        self.history.commit(conv)

    # -- conversation moves -------------------------------------------------------------------------

    def regenerate(self, key: str, on_event: EventFn = _ignore) -> Done | None:
        """Ask for the last reply again (the history up to it is resent); the old reply stays
        as a version (`alternatives`, `show_alternative`), in the store too."""
        conv = self._claim(key)
        try:
            index, old = branches.begin_regenerate(conv)
            done = self._turn(conv, on_event, withdraw=False, regenerated=True,
                              seed_offset=len(conv.alternatives.get(index, [])))
            branches.end_regenerate(conv, index, old, done)
            self.history.commit(conv, on_event)
            return done
        finally:
            conv.busy = False

    def alternatives(self, key: str, index: int) -> tuple[int, int]:
        """(shown, count) versions of the reply at message `index` (into conv.messages)."""
        return self.get(key).alternative_index(index)

    def show_alternative(self, key: str, index: int, step: int) -> str:
        """Show the previous (-1) or next (+1) version of the last reply; returns its text. The
        next message continues from the shown one (it is the one sent)."""
        conv = self._idle(key)
        text = branches.show_alternative(conv, index, step)
        self.history.commit(conv)  # the version shown is the branch the chat continues on
        return text

    # delete_version: OpenChats (registry.py)

    def edit(self, key: str, index: int, text: str,
             on_event: EventFn = _ignore) -> tuple[Done | None, Conversation | None]:
        """Replace the user message at `index` and ask again. What followed it is kept as a fork
        (returned, "title (fork)", a stored chat of its own). Returns (Done or None, the fork)."""
        conv = self._claim(key)
        try:
            if not 0 <= index < len(conv.messages) or conv.messages[index].get("role") != "user":
                raise ValueError(f"message {index} is not a user message")
            check = self._fit(conv, text, upto=index)
            if not check.fits:
                on_event(ContextWontFit(check))
                return None, None
            fork = self._branch(conv, len(conv.messages), keep_created=True)
            self.history.commit(fork, on_event, forked_from=conv.store_id)
            del conv.messages[index:]
            conv.alternatives = {i: v for i, v in conv.alternatives.items() if i < index}
            conv.messages.append({"role": "user", "content": text})
            return self._turn(conv, on_event), fork
        finally:
            conv.busy = False

    def fork(self, key: str, upto: int, on_event: EventFn = _ignore) -> Conversation:
        """A new chat holding conv.messages[:upto], stored as "title (fork)"; its first message
        sends that history (a Forked event with nothing copied: the server's cache holds what
        it holds)."""
        t0 = time.perf_counter()
        conv = self._claim(key)
        try:
            if not 0 < upto <= len(conv.messages):
                raise ValueError(f"cannot fork at {upto} of {len(conv.messages)} messages")
            fork = self._branch(conv, upto)
        finally:
            conv.busy = False
        self.history.commit(fork, on_event, forked_from=conv.store_id)
        on_event(Forked(conversation=fork.key, parent=conv.key, at_message=upto, tokens=0, source="none",
                        replayed=0, ms=(time.perf_counter() - t0) * 1000.0))
        return fork

    def _branch(self, conv: Conversation, upto: int, keep_created: bool = False) -> Conversation:
        taken = [c.title for c in self.list()] + [c.title for c in self.history.store.list()]
        fork = branches.branch(conv, self.conversations.new_key(), branches.fork_title(conv.display_title, taken),
                               upto, RemoteConversation, keep_created=keep_created)
        fork.model_spec = conv.model_spec
        return self.conversations.add(fork)

    # -- finding and opening stored chats ------------------------------------------------------------

    def search(self, pattern: str, regex: bool = False) -> list[ChatHit]:
        """Every stored chat whose title or any message (every branch) matches (the store's
        grep), each with how it opens here. ValueError for a bad regular expression."""
        open_ids = {c.store_id for c in self.list() if c.store_id}
        return [ChatHit(hit.chat.id, hit.chat.display_title, hit.where, hit.snippet,
                        "open now" if hit.chat.id in open_ids else "the server re-reads it at the next message")
                for hit in self.history.store.grep(pattern, regex=regex)]

    def resume(self, query: str, on_event: EventFn = _ignore) -> Conversation:
        """Open a stored chat by its id prefix or title; LookupError when none or several match."""
        found = self.history.store.find(query)
        if len(found) > 1:
            names = ", ".join(f"{c.id[:8]} {c.display_title!r}" for c in found[:5])
            raise LookupError(f"{query!r} matches {len(found)} chats: {names}")
        if not found:
            raise LookupError(f"no chat matches {query!r} (see `ds4tui chats ls`)")
        return self.open_stored(found[0].id, on_event)

    def open_file(self, sha: str, on_event: EventFn = _ignore) -> Conversation:
        """The cache browser's resume: the stored chat whose titled .kv file is `sha` (its text
        goes to the server); LookupError for any other file."""
        stored = self.history.store.by_kv_sha(sha)
        if stored is None:
            raise LookupError(f"{sha[:12]} is no stored chat's file: a .kv file alone needs the embedded engine")
        return self.open_stored(stored.id, on_event)

    def import_existing(self) -> ImportReport:
        """Bring the remote JSON transcripts of an older ds4tui into the store, once per file
        (chat/history_import.py); the titled .kv sessions are the embedded chat's to import.
        Reads files: call off the UI thread."""
        return import_existing(self.history.store, None, paths.transcripts_dir())

    def stored_chats(self, archived: bool = False) -> list[StoredChat]:
        """Every stored chat that is not open now (local ones too: their text is sent), most
        recently used first."""
        return self.history.listing({c.store_id for c in self.list() if c.store_id}, archived)

    def kv_on_disk(self, chat: StoredChat) -> bool:
        """Always False: what the server keeps of a chat is its own business; here only the text."""
        return False

    def open_stored(self, chat_id: str, on_event: EventFn = _ignore) -> Conversation:
        """Open a stored chat: its messages and versions now; the next message sends them all
        (a HistoryOpened event says so)."""
        for conv in self.list():
            if conv.store_id == chat_id:
                conv.touch()
                return conv
        stored = self.history.store.load(chat_id)
        base = self.history.conversation(stored, self.conversations.new_key())
        conv = RemoteConversation(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
        conv.parked_tokens = 0
        # The count stored with it (the server's last, or a local chat's file's): the context
        # meter and the fit check use it until the server counts this chat again.
        conv.remote_tokens = stored.kv_tokens
        self.conversations.add(conv)
        other = stored.model if stored.model and stored.model != self.history.model_spec else None
        on_event(HistoryOpened(conversation=conv.key, kv_tokens=0, prefill_tokens=0, made_with=other, remote=True))
        return conv

    # -- delete and archive ------------------------------------------------------------------------

    def delete(self, key: str, on_event: EventFn = _ignore) -> int:
        """Delete an open chat for good: its stored history, and the titled .kv file of a local
        chat continued here. Returns the number of files removed."""
        conv = self.get(key)
        if conv.busy:
            raise RuntimeError(f"conversation {key} is generating: cancel it first")
        files = self._delete_kv(conv.saved_sha)
        if conv.store_id is not None:
            self.history.forget(conv.store_id)
        self.conversations.remove(key)
        return files

    def delete_stored(self, chat_id: str) -> int:
        """Delete a chat that is not open (the sidebar's stored rows)."""
        for conv in self.list():
            if conv.store_id == chat_id:
                return self.delete(conv.key)
        stored = self.history.store.get(chat_id)
        if stored is None:
            raise LookupError(f"no conversation {chat_id[:12]} in the store")
        files = self._delete_kv(stored.kv_sha)
        self.history.forget(chat_id)
        return files

    def archive(self, chat_id: str, archived: bool = True) -> None:
        """Hide a stored chat from the list (kept whole; `ds4tui chats ls --archived`)."""
        self.history.store.update(chat_id, archived=archived)

    def pinned_files(self, key: str | None = None, chat_id: str | None = None) -> int:
        """1 when the titled .kv file a delete of this chat removes is pinned, else 0."""
        conv = next((c for c in self.list() if c.key == key or (chat_id and c.store_id == chat_id)), None)
        stored = None if conv is not None or chat_id is None else self.history.store.get(chat_id)
        sha = conv.saved_sha if conv is not None else (stored.kv_sha if stored is not None else None)
        if not sha or self.config.no_disk_cache:
            return 0
        from ds4tui.cache.entry import inspect_file
        from ds4tui.cache import KvStore

        path = KvStore(self.config.cache_path()).path_for(sha)
        return int(path.exists() and inspect_file(path, deep=False).pinned)

    def _delete_kv(self, sha: str | None) -> int:
        """A local chat's titled file, when this config's cache directory has it (a remote chat has none)."""
        if not sha or self.config.no_disk_cache:
            return 0
        from ds4tui.cache import KvStore

        try:
            kv = KvStore(self.config.cache_path())
            return int(kv.path_for(sha).exists() and kv.delete(sha))
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot remove its .kv file: {exc}") from None

    def shutdown(self, on_event: EventFn = _ignore) -> None:
        """Stop what runs; every turn is already in the store."""
        self.cancel()


def _chars(messages: list[dict]) -> int:
    return sum(len(m.get("content", "")) for m in messages)


