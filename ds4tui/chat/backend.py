"""The chat backend contract: what the chat screen may call on a controller.

Owns `ChatBackend`, the one interface both chat controllers implement: the embedded engine
(`chat/controller.py`, `ChatController`) and a remote OpenAI-compatible server
(`chat/remote.py`, `RemoteChatController`, `ds4tui --engine URL`). The screens call nothing
else on a controller (tests/chat/test_backend.py reads them to check), so every key works
on either backend, and a key that is offered is one both can do. History is the same on
both: each change is committed to the conversation store (chat/history.py).

Threading, for both: `send`, the moves (`regenerate`, `edit`, `fork`), the opening calls
(`resume`, `open_file`, `open_stored`), `delete*`, `search` and `shutdown` block and run on
one worker thread at a time; `cancel` may be called from any thread; the listings and
lookups (`get`, `find`, `list`, `alternatives`, `chat_settings`...) from the UI thread.
Events go to the `on_event` callback of each call, on the worker's thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ds4tui.chat.conversation import Conversation
    from ds4tui.chat.events import ChatEvent, Done, FitCheck
    from ds4tui.chat.history import ChatHit
    from ds4tui.chat.history_import import ImportReport
    from ds4tui.chat.reply_view import ReplyView
    from ds4tui.config import Config
    from ds4tui.engine.model import ModelInfo
    from ds4tui.store import StoredChat

    EventFn = Callable[[ChatEvent], None]


@runtime_checkable
class ChatBackend(Protocol):
    """Every method and property the chat screen calls on its controller."""

    # -- what the screen shows ------------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The settings now (sampling defaults, system prompt of new chats, cache directory)."""

    @property
    def model_name(self) -> str:
        """What the status bar calls the model ("tiny-llama", "NAME @ host")."""

    @property
    def model_info(self) -> ModelInfo | None:
        """The loaded model's identity (the cache browser marks the files it can resume); None remote."""

    @property
    def cache_store(self) -> Any:
        """The local KV cache (a KvStore) this backend saves to; None without one."""

    @property
    def disk_cache_notice(self) -> str | None:
        """One line when the local disk cache is off because its directory cannot be used."""

    @property
    def history_notice(self) -> str | None:
        """One line when the store's file could not be used and chats are kept in memory only."""

    def model_description(self) -> str:
        """The palette's model line."""

    def ctx_size(self) -> int:
        """Tokens of the context (0: not known, a remote server that does not say)."""

    def has_sliding_window(self) -> bool:
        """Whether the `swa_policy` setting means anything here (F3 shows the field only then)."""

    def warm_up(self) -> None:
        """First-use costs, paid off the UI thread before the first message."""

    def live_count(self) -> int:
        """Live engine sessions that the shutdown will save."""

    # -- open chats ---------------------------------------------------------------------------------

    def new_conversation(self, system_prompt: str | None = None) -> Conversation: ...

    def get(self, key: str) -> Conversation:
        """The open chat `key`; KeyError when there is none."""

    def find(self, key: str) -> Conversation | None: ...

    def list(self) -> list[Conversation]: ...

    def rename(self, key: str, title: str, on_event: EventFn = ...) -> None:
        """A new title (ValueError when empty), committed."""

    def close(self, key: str, on_event: EventFn = ...) -> None:
        """Forget an open chat in memory (its history stays stored)."""

    def update_config(self, **changes) -> None:
        """Change the defaults of new chats (F3's "Also the default")."""

    def reply_view(self, text: str) -> ReplyView:
        """A stored reply split as the chat shows it: reasoning (folded), answer, tool calls."""

    def fresh_like(self, key: str) -> Conversation:
        """A new, empty chat with this chat's system prompt and settings."""

    def keep_draft(self, key: str, text: str) -> None:
        """A message never sent (queued when the app quit): stored as the chat's unanswered last
        message, so that it comes back in the message box when the chat is opened again."""

    def import_messages(self, messages: list[dict], title: str | None = None,
                        created_at: int | None = None) -> Conversation:
        """A transcript (OpenAI messages) opened as a new, stored chat."""

    # -- per-chat settings (F3) -------------------------------------------------------------------

    def chat_settings(self, key: str) -> dict:
        """The chat's sampling (settings.CHAT_KEYS) and system prompt, as its next turn uses them."""

    def set_chat_settings(self, key: str, **changes) -> None:
        """Change the chat's sampling and system prompt; ValueError for a key that is not one,
        RuntimeError while it generates."""

    # -- a turn and the moves ---------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop the running turn at its next chunk or token (any thread)."""

    def send(self, key: str, text: str, on_event: EventFn = ...) -> Done | None:
        """Add a user message and generate the reply: Done, or None when cancelled before a token
        or failed (the message is then withdrawn). A message that does not fit is not sent: a
        ContextWontFit event carries the choices."""

    def regenerate(self, key: str, on_event: EventFn = ...) -> Done | None:
        """The last reply again; the old one stays as a version. ValueError when there is none."""

    def alternatives(self, key: str, index: int) -> tuple[int, int]:
        """(shown, count) versions of the reply at message `index`."""

    def show_alternative(self, key: str, index: int, step: int) -> str:
        """Show the previous (-1) or next (+1) version of the last reply; returns its text."""

    def delete_version(self, key: str, index: int) -> str:
        """Delete the shown version of the last reply, in the store too; returns the text now
        shown (the version before it). ValueError when it is the only one."""

    def edit(self, key: str, index: int, text: str,
             on_event: EventFn = ...) -> tuple[Done | None, Conversation | None]:
        """Replace the user message at `index` and answer again; the old continuation is kept
        as a fork (returned)."""

    def fork(self, key: str, upto: int, on_event: EventFn = ...) -> Conversation:
        """A new chat holding the first `upto` messages (a Forked event says what was copied)."""

    def check_fit(self, key: str, text: str) -> FitCheck:
        """Whether `text` as the next message fits with room for a reply, and the choices when not."""

    def drop_oldest(self, key: str, turns: int) -> None:
        """Drop the oldest `turns` exchanges (system prompt kept): a choice after check_fit."""

    # -- stored chats ---------------------------------------------------------------------------------

    def search(self, pattern: str, regex: bool = False) -> list[ChatHit]:
        """Stored chats whose title or messages (every branch) match, each with how it would
        open here (`open_stored` takes a hit's `chat_id`); ValueError for a bad regex."""

    def resume(self, query: str, on_event: EventFn = ...) -> Conversation:
        """Open a chat by its store id prefix or title; LookupError when none or several match."""

    def open_file(self, sha: str, on_event: EventFn = ...) -> Conversation:
        """Open the .kv file the cache browser chose (a stored chat's titled file opens that chat)."""

    def import_existing(self) -> ImportReport:
        """Bring the chats of an older ds4tui (titled .kv sessions, remote JSON transcripts)
        into the store, once per file."""

    def stored_chats(self, archived: bool = False) -> list[StoredChat]:
        """Stored chats that are not open now, most recently used first (the sidebar)."""

    def kv_on_disk(self, chat: StoredChat) -> bool:
        """Whether a stored chat's KV is still cached here (else the sidebar says: text only)."""

    def open_stored(self, chat_id: str, on_event: EventFn = ...) -> Conversation:
        """Open a stored chat with its versions (a HistoryOpened event says what its next turn costs)."""

    def delete(self, key: str, on_event: EventFn = ...) -> int:
        """Delete an open chat for good (history and .kv files); returns the files removed."""

    def delete_stored(self, chat_id: str) -> int:
        """Delete a chat that is not open."""

    def pinned_files(self, key: str | None = None, chat_id: str | None = None) -> int:
        """How many of the .kv files a delete of this chat would remove are pinned (the screen
        asks again for them); reads headers."""

    def archive(self, chat_id: str, archived: bool = True) -> None:
        """Hide a stored chat from the list (or bring it back)."""

    def shutdown(self, on_event: EventFn = ...) -> None:
        """Stop what runs and save what needs saving; the backend stays usable."""
