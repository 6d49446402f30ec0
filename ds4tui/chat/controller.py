"""The chat controller: the one object the UI (and benches, and tests) drive, headless.

A façade over the chat's parts, each in its own module:
- registry.py: the open conversations;
- settings.py: the settings a running chat may change;
- pool.py: the live engine sessions (LRU cap, `evict` and `shutdown` saves);
- turn.py: one turn (live/disk/cold prefix, prefill with checkpoints, streaming);
- saved.py: titled sessions (save after each reply, list, rename, reopen);
- checkpoints.py: the bridge to the disk cache (ds4tui.cache).
It never imports textual or rich: a test checks.

Threading: `send`, `resume`, `open_file` and `shutdown` block and are meant for one
worker thread at a time; `cancel` may be called from any thread, and the listing
and lookup methods from the UI thread. Events go to the `on_event` callback of each
call, on the worker's thread.
"""

from __future__ import annotations

import threading
from typing import Callable

from ds4tui.cache.policy import CachePolicy
from ds4tui.cache.safe_open import dir_problem
from ds4tui.cache.store import KvStore
from ds4tui.chat.checkpoints import Checkpoints, SavedSession
from ds4tui.chat.conversation import MAX_TITLE_CHARS, Conversation, default_title
from ds4tui.chat.events import ChatError, ChatEvent, Done
from ds4tui.chat.pool import SessionPool
from ds4tui.chat.registry import Conversations
from ds4tui.chat.saved import SavedSessions
from ds4tui.chat.settings import Settings
from ds4tui.chat.turn import TurnPipeline
from ds4tui.config import Config
from ds4tui.engine.errors import EngineError
from ds4tui.engine.model import Model, ModelInfo
from ds4tui.engine.sampling import SamplingParams

EventFn = Callable[[ChatEvent], None]


def _ignore(_: ChatEvent) -> None:
    pass


class ChatController:
    """Every open conversation of one model, and the disk cache they share."""

    def __init__(self, model: Model, config: Config | None = None, *, policy: CachePolicy | None = None) -> None:
        self.model = model
        self.settings = Settings(config)
        self.policy = policy or CachePolicy(budget_mb=self.settings.config.budget_mb)
        self.checkpoints: Checkpoints | None = None
        # Set when the disk cache is off because its directory cannot be used (not a
        # directory, read-only): one line the UI shows; the chat goes on without it.
        self.disk_cache_notice: str | None = None
        if not self.settings.config.no_disk_cache:
            problem = dir_problem(self.settings.config.cache_path(), write=True)
            if problem:
                self.disk_cache_notice = f"disk cache off: {problem}"
            else:
                self.checkpoints = Checkpoints(model, self.settings.config.cache_path(), self.policy,
                                               ctx_size=self.settings.config.ctx)
        self.conversations = Conversations()
        self._stop = threading.Event()
        self.pool = SessionPool(model, self.settings, self.conversations, self.checkpoints)
        self.turns = TurnPipeline(model, self.settings, self.pool, self.checkpoints, self.policy, self._stop)
        self.saved = SavedSessions(model, self.checkpoints, self.pool, self.conversations)

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

    @property
    def cache_store(self) -> KvStore | None:
        """The disk cache this controller saves to; None with --no-disk-cache."""
        return self.checkpoints.store if self.checkpoints is not None else None

    # -- conversations ------------------------------------------------------------------------

    def new_conversation(self, system_prompt: str | None = None) -> Conversation:
        """An empty chat; the system prompt (argument, else config) is fixed for its lifetime."""
        prompt = system_prompt if system_prompt is not None else self.config.system_prompt
        conv = Conversation(key=self.conversations.new_key())
        if prompt:
            conv.messages.append({"role": "system", "content": prompt})
        return self.conversations.add(conv)

    def get(self, key: str) -> Conversation:
        return self.conversations.get(key)

    def find(self, key: str) -> Conversation | None:
        """The open conversation with this key, or None (it was closed meanwhile)."""
        return self.conversations.find(key)

    def list(self) -> list[Conversation]:
        return self.conversations.all()

    def ctx_size(self) -> int:
        """Context size of this controller's sessions (the engine's default unless config.ctx is set)."""
        return self.pool.ctx_size()

    def warm_up(self) -> None:
        """Pay the engine's first-use costs for sessions of ctx_size() now, off the UI thread
        (the app's model-loading worker): see Model.warm_up. Changes no result."""
        self.model.warm_up(self.ctx_size())

    def live_count(self) -> int:
        return self.pool.live_count()

    def saved_sessions(self) -> list[SavedSession]:
        """Titled sessions on disk that this model can load and that are not open already."""
        return self.saved.listing()

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
            done = self.turns.run(conv, on_event)
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
            self.saved.save(conv, on_event)
        return done

    # -- saved sessions --------------------------------------------------------------------------

    def resume(self, query: str, on_event: EventFn = _ignore) -> Conversation:
        """Open a titled session (file-name prefix or exact title): transcript and KV, no prefill.

        Raises LookupError when nothing (or more than one file) matches, EngineError
        when the file cannot be restored into this model.
        """
        if self.disk_cache_notice:
            raise LookupError(f"{self.disk_cache_notice}: nothing to resume")
        return self.saved.resume(query, on_event)

    def open_file(self, sha: str, on_event: EventFn = _ignore) -> Conversation:
        """Open any checkpoint this model wrote (the cache browser's resume), titled or not."""
        if self.disk_cache_notice:
            raise LookupError(f"{self.disk_cache_notice}: nothing to resume")
        return self.saved.open_file(sha, on_event)

    def shutdown(self, on_event: EventFn = _ignore) -> None:
        """Save every live session (reason `shutdown`) and free them; the controller stays usable."""
        self._stop.set()
        self.pool.free_all("shutdown", on_event)
