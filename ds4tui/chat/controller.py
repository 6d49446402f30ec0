"""The chat controller: the one object the UI (and benches, and tests) drive, headless.

A façade over the chat's parts, each in its own module:
- registry.py: the open conversations;
- settings.py: the settings a running chat may change;
- pool.py: the live engine sessions (LRU cap, `evict` and `shutdown` saves);
- turn.py: one turn (live/disk/cold prefix, prefill with checkpoints, streaming);
- saved.py: titled sessions (save after each reply, list, rename, reopen);
- moves.py: regenerate, edit and resend, fork, the context-fit check;
- checkpoints.py: the bridge to the disk cache (ds4tui.cache);
- history.py: the bridge to the conversation store (ds4tui.store), the record of every chat:
  each change is committed there, and the chat list comes from it. The .kv files are only a
  cache: a chat whose files were evicted opens from its text and re-prefills.
It never imports textual or rich: a test checks.

Threading: `send`, `resume`, `open_file` and `shutdown` block and are meant for one
worker thread at a time; `cancel` may be called from any thread, and the listing
and lookup methods from the UI thread. Events go to the `on_event` callback of each
call, on the worker's thread.
"""

from __future__ import annotations

import threading
from typing import Callable

from ds4tui import paths
from ds4tui.cache.policy import CachePolicy
from ds4tui.cache.safe_open import dir_problem
from ds4tui.cache.store import KvStore
from ds4tui.chat import branches
from ds4tui.chat.checkpoints import Checkpoints, SavedSession
from ds4tui.chat.conversation import MAX_TITLE_CHARS, Conversation, default_title
from ds4tui.chat.events import ChatError, ChatEvent, ContextWontFit, Done, FitCheck, HistoryOpened
from ds4tui.chat.history import ChatHit, History
from ds4tui.chat.moves import Moves
from ds4tui.chat.next_turn import open_next_turn
from ds4tui.chat.pool import SessionPool
from ds4tui.chat.registry import Conversations, OpenChats
from ds4tui.chat.reply_view import ReplyFormat, ReplySplitter, ReplyView, view_of
from ds4tui.chat.saved import SavedSessions
from ds4tui.chat.settings import CHAT_KEYS, Settings
from ds4tui.chat.turn import TurnPipeline
from ds4tui.config import Config
from ds4tui.engine.errors import EngineError
from ds4tui.engine.model import Model, ModelInfo
from ds4tui.engine.sampling import Sampler, SamplingParams
from ds4tui.errors import error_line
from ds4tui.store import ConversationStore, StoredChat, open_store

EventFn = Callable[[ChatEvent], None]


def _ignore(_: ChatEvent) -> None:
    pass


class ChatController(OpenChats):
    """Every open conversation of one model, and the disk cache they share."""

    def __init__(self, model: Model, config: Config | None = None, *, policy: CachePolicy | None = None,
                 store: ConversationStore | None = None) -> None:
        self.model = model
        self.settings = Settings(config)
        # The record of every chat. A file that cannot be used gives a store in memory whose
        # notice the UI shows (this session's chats are then at risk, and it says so).
        self.history = History(store or open_store(paths.store_path(self.settings.config.data_dir)),
                               model_spec=self.settings.config.model)
        self.policy = policy or self.settings.config.cache_policy()  # budget and checkpoint interval
        self.checkpoints: Checkpoints | None = None
        # Set when the disk cache is off because its directory cannot be used (not a
        # directory, read-only): one line the UI shows; the chat goes on without it.
        self.disk_cache_notice: str | None = None
        if not self.settings.config.no_disk_cache:
            problem = dir_problem(self.settings.config.cache_path(), write=True)
            if problem:
                self.disk_cache_notice = f"disk cache off: {problem}"
            else:
                # model_spec: the directory notes which model writes there, so that `--resume`
                # opens a session with its own model (chat/model_memo.py).
                self.checkpoints = Checkpoints(model, self.settings.config.cache_path(), self.policy,
                                               ctx_size=self.settings.config.ctx, model_spec=self.settings.config.model)
        self.conversations = Conversations()
        self._stop = threading.Event()
        self._reply_format: ReplyFormat | None = None  # worked out from the template when first needed
        self.pool = SessionPool(model, self.settings, self.conversations, self.checkpoints)
        self.turns = TurnPipeline(model, self.settings, self.pool, self.checkpoints, self.policy, self._stop)
        self.saved = SavedSessions(model, self.checkpoints, self.pool, self.conversations)
        self.moves = Moves(model, self.settings, self.pool, self.checkpoints, self.conversations,
                           self.saved, self.turns)

    @property
    def config(self) -> Config:
        return self.settings.config

    @property
    def model_name(self) -> str:
        """What the status bar calls the model."""
        return self.model.info.name

    @property
    def model_info(self) -> ModelInfo | None:
        """The loaded model's identity (the cache browser marks the files it can resume)."""
        return self.model.info

    def model_description(self) -> str:
        """The model info line: architecture, weight types, attention layout, chat format."""
        return self.model.describe()

    @property
    def cache_store(self) -> KvStore | None:
        """The disk cache this controller saves to; None with --no-disk-cache."""
        return self.checkpoints.store if self.checkpoints is not None else None

    # -- conversations ------------------------------------------------------------------------

    # new_conversation, get, find, list: OpenChats (registry.py)

    def ctx_size(self) -> int:
        """Context size of this controller's sessions (the engine's default unless config.ctx is set)."""
        return self.pool.ctx_size()

    def has_sliding_window(self) -> bool:
        """Whether this model's sessions have sliding-window layers, i.e. whether the
        `swa_policy` setting means anything here (Session.set_storage_policy). Call off
        the UI thread the first time (it may probe with a session; warm_up does)."""
        return self.pool.sliding_window()

    def warm_up(self) -> None:
        """Pay the engine's first-use costs for sessions of ctx_size() now, off the UI thread
        (the app's model-loading worker): see Model.warm_up. Changes no result. Also the first
        lookup's reads (every header and titled text of the cache) and the template's and the
        tokenizer's first calls, which a first message would otherwise wait for."""
        self.model.warm_up(self.ctx_size(), kv_dtype=self.settings.config.kv_dtype)
        if self.checkpoints is not None:
            self.checkpoints.prime(self.ctx_size())
        self.model.tokenizer.encode(self.model.chat.render([{"role": "user", "content": "Hi."}]))
        # The sampler's first calls (numpy's generator set-up, the logits' view as an array)
        # cost a first reply ~0.2 ms more than the next ones: paid here instead.
        import torch  # loaded by now: the model is

        for params in (SamplingParams(temperature=0.0), SamplingParams()):
            Sampler(params)(torch.zeros(8))

    def live_count(self) -> int:
        return self.pool.live_count()

    def saved_sessions(self, with_problems: bool = False) -> list[SavedSession]:
        """Titled sessions on disk that this model can load and that are not open already;
        `with_problems`: also the ones that cannot be resumed, each with its `problem`
        (a corrupt or unloadable titled session never drops out of a list silently)."""
        return self.saved.listing(with_problems)

    def find_saved(self, query: str) -> list[SavedSession]:
        """Titled sessions whose file name starts with `query` or whose title equals it."""
        return self.saved.find(query)

    def rename(self, key: str, title: str, on_event: EventFn = _ignore) -> None:
        """Give a chat a new title; its titled file (if any) moves to the new name."""
        title = " ".join(title.split())
        if not title:
            raise ValueError("a title must not be empty")
        if len(title) > MAX_TITLE_CHARS:
            title = default_title(title, MAX_TITLE_CHARS)
        conv = self.get(key)
        conv.title = title
        self.saved.retitle(conv, on_event)
        self.history.commit(conv, on_event)

    def close(self, key: str, on_event: EventFn = _ignore) -> None:
        """Forget a chat in memory (its titled file stays); the session is saved first (`evict`)."""
        conv = self.get(key)
        if conv.live:
            self.pool.free(conv, "evict", on_event)
        self.conversations.remove(key)

    # -- settings ---------------------------------------------------------------------------------

    def sampling_params(self) -> SamplingParams:
        return self.settings.sampling_params()

    def update_config(self, **changes) -> None:
        """Settings the UI may change while running (sampling, max tokens, system prompt of new
        chats, the SWA policy of the next checkpoints)."""
        self.settings.update(**changes)
        if "swa_policy" in changes:
            self.pool.apply_storage_policy()

    # -- a turn ------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Ask the running turn to stop at the next chunk or token (any thread)."""
        self._stop.set()

    def send(self, key: str, text: str, on_event: EventFn = _ignore) -> Done | None:
        """Add a user message and generate the reply. Returns Done, or None when cancelled in
        prefill or failed (both reported through on_event; the user message is then withdrawn).

        A message that will not fit the context (check_fit) is not sent: a ContextWontFit
        event carries the choices and nothing is changed or truncated.
        """
        conv = self._claim(key)
        try:
            check = self.moves.check_fit(conv, text)
            if not check.fits:
                on_event(ContextWontFit(check))
                return None
        finally:
            conv.busy = False
        if conv.model_spec and conv.model_spec != self.config.model:
            self.history.record_model(conv)  # a chat of another model continues on this one
        conv.messages.append({"role": "user", "content": text})
        untitled = conv.title is None
        if untitled:
            conv.title = default_title(text)
        # Committed before the reply: a crash while it streams loses only the reply (the
        # message comes back as the chat's draft).
        self.history.commit(conv, on_event)
        done = self._turn(conv, on_event)
        if done is None and untitled:
            self._forget_unsent(conv)
        return done

    def _claim(self, key: str) -> Conversation:
        conv = self.get(key)
        if conv.busy:
            raise RuntimeError(f"conversation {key} is already generating")
        self._stop.clear()
        conv.busy = True
        conv.touch()
        return conv

    def _turn(self, conv: Conversation, on_event: EventFn, withdraw: bool = True, **kw) -> Done | None:
        """Run one turn on conv's messages (they end with the user message); save after it.
        withdraw: a turn that failed or was cancelled in its prefill takes the message off."""
        conv.busy = True
        # The screen gets the reasoning, the answer and the calls apart (reply_view.py); the
        # session and the history keep the model's text as it was written.
        on_event = ReplySplitter(on_event, self.reply_format)
        try:
            done = self.turns.run(conv, on_event, **kw)
            if done is not None:
                self._open_next_turn(conv, on_event)
        except EngineError as exc:  # a full context, a refused file: the engine left the session sound
            on_event(ChatError("generate", str(exc)))
            done = None
        except Exception as exc:  # a bug must not take the app down; the session may be torn
            on_event(ChatError("generate", error_line(exc)))
            conv.session, conv.session_text = None, b""
            done = None
        finally:
            conv.busy = False
        if withdraw and done is None and conv.messages and conv.messages[-1].get("role") == "user":
            conv.messages.pop()
        if done is not None:
            self.saved.save(conv, on_event)
        # The reply (or as much of it as a cancel left), or the withdrawn message.
        self.history.commit(conv, on_event)
        self.pool.prepare_next()  # while the user reads the reply: the next chat's memory
        return done

    @property
    def reply_format(self) -> ReplyFormat:
        """How this model's replies split into reasoning, answer and tool calls."""
        if self._reply_format is None:
            self._reply_format = ReplyFormat.of(self.model.chat)
        return self._reply_format

    def reply_view(self, text: str) -> ReplyView:
        """A stored reply as the chat shows it: reasoning (folded), answer, tool calls."""
        return view_of(text, self.reply_format)

    def _open_next_turn(self, conv: Conversation, on_event: EventFn) -> None:
        """The next user turn's opening into the live session (next_turn.py), before the titled
        save so that the file holds it too. The reply stands whatever happens here."""
        try:
            open_next_turn(conv, self.model.chat, self.model.tokenizer, self.turns.text_of, self._stop.is_set)
        except Exception as exc:  # the session may be torn: the next turn starts from disk or cold
            on_event(ChatError("generate", f"opening the next turn: {error_line(exc)}"))
            conv.session, conv.session_text = None, b""

    # -- conversation moves (moves.py) ---------------------------------------------------------

    def regenerate(self, key: str, on_event: EventFn = _ignore) -> Done | None:
        """Sample the last reply again from the prompt's end: the live session rewinds there
        (free on the llama family: no prefill, no forward before the first token). The old
        reply stays as an alternative (`alternatives`, `show_alternative`)."""
        conv = self._claim(key)
        try:
            index, old = self.moves.begin_regenerate(conv)
        except BaseException:
            conv.busy = False
            raise
        done = self._turn(conv, on_event, withdraw=False,
                          seed_offset=len(conv.alternatives.get(index, [])), regenerated=True)
        self.moves.end_regenerate(conv, index, old, done)
        self.history.commit(conv, on_event)
        return done

    def alternatives(self, key: str, index: int) -> tuple[int, int]:
        """(shown, count) versions of the reply at message `index` (into conv.messages)."""
        return self.get(key).alternative_index(index)

    def show_alternative(self, key: str, index: int, step: int) -> str:
        """Show the previous (-1) or next (+1) version of the last reply; returns its text.
        The next message continues from the shown one (the live session rewinds to the
        prompt and prefills that reply's text)."""
        conv = self._idle(key)
        text = self.moves.show_alternative(conv, index, step)
        self.history.commit(conv)  # the version shown is the branch the chat continues on
        return text

    # delete_version: OpenChats (registry.py)

    def edit(self, key: str, index: int, text: str, on_event: EventFn = _ignore) -> tuple[Done | None, Conversation | None]:
        """Replace the user message at `index` (into conv.messages) and answer it again.

        What followed it is kept as a fork (returned, "title (fork)", its file the chat's
        saved state); the chat rewinds to just before the message and prefills only the
        edited text. Returns (Done or None, the fork or None when there was nothing to keep).
        """
        conv = self._claim(key)
        try:
            check = self.moves.check_fit(conv, text, upto=index)
            if not check.fits:
                on_event(ContextWontFit(check))
                return None, None
            fork = self.moves.keep_continuation(conv, index, on_event)
            if fork is not None:
                self.history.commit(fork, on_event, forked_from=conv.store_id)
        finally:
            conv.busy = False
        del conv.messages[index:]
        conv.alternatives = {i: v for i, v in conv.alternatives.items() if i < index}
        conv.messages.append({"role": "user", "content": text})
        return self._turn(conv, on_event), fork

    def fork(self, key: str, upto: int, on_event: EventFn = _ignore) -> Conversation:
        """A new chat holding conv.messages[:upto], its session a copy of the parent's state
        there: no prefill (in memory when the parent is live, else from its .kv file). Saved
        as its own titled session "title (fork)". A Forked event says what was copied."""
        conv = self._claim(key)
        try:
            fork = self.moves.fork(conv, upto, on_event)
        finally:
            conv.busy = False
        self.history.commit(fork, on_event, forked_from=conv.store_id)
        self.pool.prepare_next()  # the fork took the spare, if there was one
        return fork

    def check_fit(self, key: str, text: str) -> FitCheck:
        """Whether `text` as the next message fits the context with room for a reply, and the
        choices when not (drop the oldest exchanges: how many, what it re-prefills; a fresh chat)."""
        return self.moves.check_fit(self.get(key), text)

    def drop_oldest(self, key: str, turns: int) -> None:
        """Drop the oldest `turns` user/assistant exchanges, keeping the system prompt (the
        caller's choice after check_fit). The next turn re-prefills what follows the system prompt."""
        conv = self._idle(key)
        self.moves.drop_oldest(conv, turns)
        self.history.commit(conv)

    # fresh_like, import_messages: OpenChats (registry.py); an imported chat's next message
    # prefills it (or restores the longest cached prefix of it).

    def search(self, pattern: str, regex: bool = False) -> list[ChatHit]:
        """Every stored chat whose title or any message (every branch) matches, each with how
        it would open here. Reads the store and checks files: call off the UI thread.
        ValueError for a bad regular expression."""
        open_ids = {c.store_id for c in self.list() if c.store_id}
        out = []
        for hit in self.history.store.grep(pattern, regex=regex):
            chat = hit.chat
            if chat.id in open_ids:
                how = "open now"
            elif chat.model and chat.model != self.config.model:
                how = f"made with {chat.model}: continuing here re-prefills"
            elif self.kv_on_disk(chat):
                how = f"load {chat.kv_tokens:,} tok from disk, no prefill"
            else:
                how = "text only: the next message re-prefills"
            out.append(ChatHit(chat.id, chat.display_title, hit.where, hit.snippet, how))
        return out

    # -- per-chat settings -------------------------------------------------------------------------

    def set_chat_settings(self, key: str, **changes) -> None:
        """Change one chat's sampling (CHAT_KEYS) and system prompt; new chats keep the
        config's defaults. A new system prompt changes the first message: the next turn
        re-prefills from there (the live session rewinds to the start)."""
        conv = self._idle(key)
        if "system_prompt" in changes:
            branches.set_system_prompt(conv, changes.pop("system_prompt"))
        unknown = set(changes) - set(CHAT_KEYS)
        if unknown:
            raise ValueError(f"not a chat setting: {', '.join(sorted(unknown))}")
        conv.overrides.update(changes)
        self.history.commit(conv)

    # -- saved sessions --------------------------------------------------------------------------

    def resume(self, query: str, on_event: EventFn = _ignore) -> Conversation:
        """Open a chat by its store id prefix or title (else a titled .kv file's name or title).

        Raises LookupError when nothing (or more than one chat) matches, EngineError
        when a titled file named this way cannot be restored into this model.
        """
        found = self.history.store.find(query)
        if len(found) == 1:
            return self.open_stored(found[0].id, on_event)
        if len(found) > 1:
            names = ", ".join(f"{c.id[:8]} {c.display_title!r}" for c in found[:5])
            raise LookupError(f"{query!r} matches {len(found)} chats: {names}")
        if self.disk_cache_notice:  # no titled .kv file to look for either
            raise LookupError(f"no chat matches {query!r} (see `ds4tui chats ls`; {self.disk_cache_notice})")
        conv = self.saved.resume(query, on_event)
        self.history.commit(conv, on_event)
        return conv

    def open_file(self, sha: str, on_event: EventFn = _ignore) -> Conversation:
        """Open any checkpoint this model wrote (the cache browser's resume), titled or not;
        a chat's own titled file opens that chat."""
        stored = self.history.store.by_kv_sha(sha)
        if stored is not None:
            return self.open_stored(stored.id, on_event)
        if self.disk_cache_notice:
            raise LookupError(f"{self.disk_cache_notice}: nothing to resume")
        conv = self.saved.open_file(sha, on_event)
        self.history.commit(conv, on_event)
        return conv

    # -- the conversation store ----------------------------------------------------------------

    @property
    def history_notice(self) -> str | None:
        """Set when the store's file could not be used and chats are kept in memory only."""
        return self.history.notice

    def import_existing(self):
        """Bring every titled .kv session of the cache directory and every remote transcript
        of an older ds4tui into the store, once per file (chat/history_import.py); returns the
        ImportReport. Reads files: call off the UI thread."""
        from ds4tui.chat.history_import import import_existing

        cache = self.checkpoints.store.dir if self.checkpoints is not None else None
        return import_existing(self.history.store, cache, paths.transcripts_dir())

    def stored_chats(self, archived: bool = False) -> list[StoredChat]:
        """Every stored chat that is not open now, most recently used first (the sidebar)."""
        return self.history.listing({c.store_id for c in self.list() if c.store_id}, archived)

    def kv_on_disk(self, chat: StoredChat) -> bool:
        """Whether a stored chat's titled .kv file is still in the cache (else: text only)."""
        return bool(chat.kv_sha and self.checkpoints is not None
                    and self.checkpoints.store.path_for(chat.kv_sha).exists())

    def open_stored(self, chat_id: str, on_event: EventFn = _ignore) -> Conversation:
        """Open a stored chat: its messages and versions now, its KV at the next turn (from its
        titled file when the cache still has it, else the longest cached prefix, else a
        prefill). A HistoryOpened event says which, and what a re-prefill costs."""
        for conv in self.list():
            if conv.store_id == chat_id:
                conv.touch()
                return conv
        stored = self.history.store.load(chat_id)
        conv = self.history.conversation(stored, self.conversations.new_key())
        other = conv.model_spec if conv.model_spec and conv.model_spec != self.config.model else None
        # Its own titled file, restored now when the cache still has it: the chat is live and
        # its next message prefills only itself.
        problem = None
        if other is None and self.kv_on_disk(stored):
            problem = self.saved.restore(conv, on_event)
            if problem is not None:
                problem = f"its .kv file was refused ({problem})"
        if conv.session is None:
            conv.saved_sha, conv.saved_upto, conv.parked_tokens = None, 0, 0
        prefill = 0
        if conv.session is None and conv.messages:
            prefill = len(self.model.tokenizer.encode(self.model.chat.render(conv.messages, now=conv.template_now)))
        self.conversations.add(conv)
        self.pool.prepare_next()
        on_event(HistoryOpened(conversation=conv.key, kv_tokens=conv.saved_upto, prefill_tokens=prefill,
                               made_with=other, remote=stored.remote, kv_problem=problem))
        return conv

    def delete(self, key: str, on_event: EventFn = _ignore) -> int:
        """Delete an open chat for good: its session (not saved), its stored history and the
        .kv files holding its own text (pinned ones too: the screen asks twice for those,
        `pinned_files`). Nothing of it is written again at quit. Returns the number of files removed."""
        conv = self.get(key)
        if conv.busy:
            raise RuntimeError(f"conversation {key} is generating: cancel it first")
        self.pool.discard(conv)
        self.conversations.remove(key)
        files = self._delete_files(conv.saved_sha, conv.messages, conv)
        if conv.store_id is not None:
            self.history.forget(conv.store_id)
        return files

    def delete_stored(self, chat_id: str) -> int:
        """Delete a chat that is not open (the sidebar's saved rows, `ds4tui chats rm`)."""
        for conv in self.list():
            if conv.store_id == chat_id:
                return self.delete(conv.key)
        stored = self.history.store.load(chat_id)
        files = self._delete_files(stored.kv_sha, list(stored.messages), None)
        self.history.forget(chat_id)
        return files

    def pinned_files(self, key: str | None = None, chat_id: str | None = None) -> int:
        """How many of the .kv files a delete of this chat (open: `key`, stored: `chat_id`) would
        remove are pinned. Reads headers: call off the UI thread."""
        if self.checkpoints is None:
            return 0
        conv = next((c for c in self.list() if c.key == key or (chat_id and c.store_id == chat_id)), None)
        if conv is not None:
            shas = self._own_files(conv.saved_sha, conv.messages, conv)
        else:
            stored = self.history.store.load(chat_id)
            shas = self._own_files(stored.kv_sha, list(stored.messages), None)
        return sum(1 for sha in shas if self.checkpoints.pinned(sha))

    def archive(self, chat_id: str, archived: bool = True) -> None:
        """Hide a stored chat from the list (kept whole; `ds4tui chats ls --archived`)."""
        self.history.store.update(chat_id, archived=archived)

    def _delete_files(self, sha: str | None, messages: list[dict], conv: Conversation | None) -> int:
        if self.checkpoints is None:
            return 0
        return sum(int(self.checkpoints.delete(own)) for own in self._own_files(sha, messages, conv))

    def _own_files(self, sha: str | None, messages: list[dict], conv: Conversation | None) -> list[str]:
        """The chat's titled file, and untitled checkpoints that hold its own text (a prefix of
        it reaching into its first user message: a shared system prompt's file stays)."""
        assert self.checkpoints is not None
        own = [sha] if sha else []
        first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
        if first_user is None:
            return own
        now = conv.template_now if conv is not None else None
        render = self.model.chat.render
        text = render(messages, now=now).encode("utf-8")
        own_from = len(render(messages[:first_user], now=now).encode("utf-8")) + 1
        acceptor = self.checkpoints.acceptor()
        for entry in self.checkpoints.store.lookup(text, acceptor):
            h = entry.header
            if entry.sha and h is not None and not h.titled and h.text_bytes >= own_from:
                own.append(entry.sha)
        return own

    def shutdown(self, on_event: EventFn = _ignore) -> None:
        """Save every live session (reason `shutdown`) and free them; the controller stays usable."""
        self._stop.set()
        self.pool.free_all("shutdown", on_event)
