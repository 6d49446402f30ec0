"""The chat screen: conversations in a sidebar, the active one in the middle, a prompt below.

Owns: the layout, the key bindings, the screen's messages and its state, the
start (the model loads, then the first chat opens) and the end (save, then exit),
and the `@on` handlers, which Textual collects only from the Screen class itself:
each hands its message to the mixin whose job it is.
Beside it, mixed in, one job each:
- chat_turns.py: sending a message, cancelling, a turn's end; opening a saved session;
- chat_workers.py: the worker threads (model load, each turn, resume, shutdown saves,
  the saved-session scan), reporting back through this screen's messages;
- chat_panes.py: a pane per open chat, switching, scrolling, the sidebar;
- chat_events.py: the controller's events on screen (streamed Markdown, the prefill
  bar, the status bar, notifications; one handler per event type; wording in
  chat_notices.py);
- chat_dialogs.py: rename, settings and the cache browser;
- chat_moves.py: regenerate, versions, edit and resend, fork, copy, find, a full context;
- chat_history.py: the stored chats: delete (asked first), archive;
- chat_model_switch.py: "Switch model": the chats stay, the one on screen reopens on the new model.
The engine never runs on the UI thread. One engine job runs at a time (the CPU has
no room for two); switching chats, typing and scrolling stay live meanwhile.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer

from ds4tui.chat import events as ev
from ds4tui.chat.startup import StartStep
from ds4tui.config import Config
from ds4tui.format.display import one_line, safe_lines
from ds4tui.screens.chat_dialogs import ChatDialogs
from ds4tui.screens.chat_events import EngineEventView
from ds4tui.screens.chat_history import ChatHistory
from ds4tui.screens.chat_model_switch import ModelSwitch, ModelSwitched
from ds4tui.screens.chat_moves import ChatMoves, ChatMovesPalette
from ds4tui.screens.chat_panes import ChatPanes
from ds4tui.screens.chat_turns import ChatTurns
from ds4tui.screens.chat_workers import EngineWorkers
from ds4tui.screens.send_queue import SendQueue
from ds4tui.screens.widgets.chat_log import MessageAction
from ds4tui.screens.widgets.conversation_list import ConversationList
from ds4tui.screens.widgets.prompt_input import PromptInput
from ds4tui.screens.widgets.start_progress import StartProgress
from ds4tui.screens.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from ds4tui.chat.backend import ChatBackend
    from ds4tui.engine.model import Model


def starting_text(step: StartStep) -> str:
    """The status line while the model is got ready (the start screen shows every step)."""
    percent = "" if step.fraction is None else f" {step.fraction:.0%}"
    return {
        "download": "downloading the model …",
        "kernels": "compiling the C kernels (once) …",
        "convert": "preparing the model for fast loading (once) …",
    }.get(step.step, "loading model…") + percent


def no_model_text(error: str) -> str:
    """What a key that needs the model says when it did not load."""
    return (f"No model is loaded ({one_line(error, 120)}). The palette's \"Switch model\" loads another;"
            " or quit (ctrl+q) and start with --model.")


NOTIFY_TIMEOUT = 4.0  # seconds a cache toast stays up: long enough to read one line


class ChatScreen(EngineEventView, ChatDialogs, ChatMoves, ChatMovesPalette, ChatHistory, ModelSwitch, ChatTurns,
                 ChatPanes, EngineWorkers, Screen):
    """The whole chat UI; the app's default screen."""

    BINDINGS = [
        # Short labels: the footer holds them all at 80 columns (the palette has the long names).
        Binding("f1", "keys_help", "Keys", show=False),  # the placeholder and the palette name it
        Binding("ctrl+n", "new_chat", "New"),
        Binding("f2", "rename", "Rename", show=False),  # in the palette; the footer is full at 80
        Binding("escape", "cancel", "Cancel"),
        Binding("f3", "settings", "Settings"),
        Binding("f4", "cache_browser", "Cache"),
        # ctrl+b and ctrl+f are in the palette; with them the footer no longer fits 80 columns.
        Binding("ctrl+b", "toggle_sidebar", "Chats", show=False),
        Binding("ctrl+r", "regenerate", "Regen"),
        Binding("ctrl+f", "find_chat", "Find", show=False),
        Binding("ctrl+pageup", "cycle_chat(-1)", "Previous chat", show=False),
        Binding("ctrl+pagedown", "cycle_chat(1)", "Next chat", show=False),
        # Priority: from the message box too (a TextArea would take them for its own cursor).
        Binding("pageup", "scroll_transcript(-1)", "Scroll", key_display="PgUp", priority=True),
        Binding("pagedown", "scroll_transcript(1)", "Scroll down", show=False, priority=True),
    ]
    """
    | Key | Description |
    | :- | :- |
    | f1 | The chat's keys. |
    | ctrl+n | Start a new chat. |
    | f2 | Rename the active chat. |
    | escape | Stop this chat's prefill or reply, or take back its queued message. |
    | f3 | Sampling settings and system prompt. |
    | f4 | Open the cache browser. |
    | ctrl+b | Show or hide the chat list. |
    | ctrl+r | Regenerate the last reply (the old one stays: ←/→ on it). |
    | ctrl+f | Find a chat: titles and messages of every stored chat. |
    | shift+tab, then enter / y / c / e / f / ← → | On a selected message: its menu, copy, copy a code block, edit and resend, fork, versions. |
    | ctrl+pageup / ctrl+pagedown | Previous / next open chat. |
    | pageup / pagedown | Scroll the transcript, from the message box too. |
    """

    # -- messages (posted by workers, bubbling to the app so tests can watch them) -----------

    @dataclass
    class ModelReady(Message):
        """The model is loaded and the controller exists."""

    @dataclass
    class Starting(Message):
        """A step of getting the model ready (download, kernels, conversion, load) moved on."""

        step: StartStep

    @dataclass
    class ModelFailed(Message):
        """Loading the model failed; `error` is one line."""

        error: str

    @dataclass
    class EngineEvent(Message):
        """The controller reported `event` (a ds4tui.chat.events record) for chat `key`."""

        key: str
        event: ev.ChatEvent

    @dataclass
    class TurnEnded(Message):
        """A send finished (`done` is None when it was cancelled in prefill or failed)."""

        key: str
        done: ev.Done | None

    @dataclass
    class Resumed(Message):
        """A titled session was opened (`key`), or could not be (`error`)."""

        key: str | None
        error: str | None = None

    @dataclass
    class SessionsSaved(Message):
        """The shutdown saves are done; the app may exit."""

    def __init__(self, config: Config, *, model: Model | None = None, controller: ChatBackend | None = None,
                 resume: str | None = None, cursor_blink: bool = True, imported: dict | None = None) -> None:
        """
        Args:
            config: Settings (the model spec is loaded in a worker unless `model` or `controller` is given).
            model: An already loaded model.
            controller: A ready controller (tests pass their own).
            resume: A titled session (sha prefix or title) to open once the model is ready.
            cursor_blink: False keeps the prompt cursor still (snapshot tests).
        """
        super().__init__()
        self.config = config
        self.controller = controller
        self._model = model
        self._resume = resume
        self._imported = imported  # {"messages", "title", "created_at"}: `ds4tui import FILE`
        self._cursor_blink = cursor_blink
        self._active: str | None = None
        self._busy: str | None = None  # key of the chat whose turn is running
        self._engine_job = False  # any engine work (turn, resume, shutdown) in flight
        self._send_queue = SendQueue()  # messages of chats waiting for another chat's reply
        self._last_interrupt = float("-inf")  # when ctrl+c was last pressed (twice within 1 s quits)
        self._event_key = ""  # the chat of the event being shown
        self._prefill_tok_s: float | None = None  # measured on the last long prefill (browser's resume cost)
        self._quitting = False
        self._queued: str | None = None  # a message sent while the model loads
        self._model_error: str | None = None  # why the model did not load (the app stays up)
        self._start_cancel = threading.Event()  # set: the model's download stops
        self._sidebar_by_user = False  # ctrl+b was pressed: the width no longer shows or hides the list
        self._saved: list = []  # (stored chat, KV on disk) pairs, as last scanned (off the UI thread)
        self._opened: dict = {}  # chat key -> its HistoryOpened event, for the resume's toast
        self._imported_history = False  # older chats (titled .kv files) imported into the store
        # Set while no engine job runs; the shutdown worker waits on it.
        self._idle = threading.Event()
        self._idle.set()

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield ConversationList(id="sidebar")
            with Vertical(id="main"):
                yield StartProgress(self.config.model, id="loading")
                yield ContentSwitcher(id="chats")
                yield PromptInput(id="prompt", placeholder="Message · Enter sends · ctrl+j new line · F1 keys",
                                  cursor_blink=self._cursor_blink)
        yield StatusBar(id="status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#prompt", PromptInput).focus()
        if self.controller is None and self._model is not None:
            self._make_controller(self._model)
        if self.controller is not None:
            self.post_message(self.ModelReady())
        else:
            # After the first frame: the worker's torch import holds the GIL for long stretches
            # and would otherwise delay the first paint and the first keys typed
            # (docs/perf-archive.md, "Start-up").
            self.call_after_refresh(self._load_model, self.config.model)

    # -- start-up ------------------------------------------------------------------------------

    @on(ModelReady)
    async def _model_ready(self) -> None:
        self.query_one("#loading").display = False
        status = self.query_one(StatusBar)
        assert self.controller is not None
        status.model_name = self.controller.model_name
        status.ctx_total = self.controller.ctx_size()
        if self.controller.disk_cache_notice:  # the chat goes on without the disk cache
            self._toast(self.controller.disk_cache_notice, "Disk cache", "warning")
        if self.controller.history_notice:  # the store's file could not be used: history at risk
            self.notify(safe_lines(self.controller.history_notice), title="History", severity="error",
                        timeout=15, markup=False)
        from ds4tui.engine.registry import base_model_note  # no torch: registry is light

        note = base_model_note(self.config.model)
        if note:  # else its echoing replies look like a broken app
            self.notify(note, title="Base model", severity="warning", timeout=12, markup=False)
        self._scan_saved()
        if self._resume:
            self._start_resume(self._resume)
        elif self._imported:
            imp = self._imported
            conv = self.controller.import_messages(imp["messages"], imp.get("title"), imp.get("created_at"))
            pane = await self._add_pane(conv.key)
            pane.log.show_messages(self._shown(conv.visible_messages()))
            self._switch(conv.key)
        else:
            await self.action_new_chat()
        if self._queued is not None and self._active is not None:
            text, self._queued = self._queued, None
            status.set_activity(None, "")  # "message queued: sent when the model is ready" is done
            self._send(self._active, text)

    @on(Starting)
    def _starting(self, message: Starting) -> None:
        self.query_one(StartProgress).show_step(message.step)
        self.query_one(StatusBar).model_name = starting_text(message.step)

    @on(ModelFailed)
    def _model_failed(self, message: ModelFailed) -> None:
        """The app stays up (the start screen says why and offers Retry; the palette's "Switch
        model" can load another), and a message typed meanwhile goes back into the box instead
        of waiting for ever."""
        self._model_error = message.error
        status = self.query_one(StatusBar)
        status.model_name = "no model"
        status.set_activity(None, "")
        if not self._start_card_shown():  # else the card says it (show_failure, below)
            self.notify(safe_lines(message.error), title="Model not loaded", severity="error", markup=False,
                        timeout=10)
        prompt = self.query_one("#prompt", PromptInput)
        if self._take_back_queued():
            self._toast("Your message was not sent: no model is loaded. It is back in the box.", "Not sent",
                        "warning")
        self.query_one(StartProgress).show_failure(f"Could not load the model: {message.error}",
                                                   focus_retry=not prompt.text.strip())

    @on(StartProgress.RetryPressed)
    def _retry_start(self) -> None:
        self._model_error = None
        self.query_one(StartProgress).reset()
        self.query_one(StatusBar).model_name = "loading model…"
        self.query_one("#prompt", PromptInput).focus()
        self._load_model(self.config.model)

    # -- messages to the mixins ----------------------------------------------------------------

    @on(PromptInput.Submitted)
    def _submit(self, message: PromptInput.Submitted) -> None:
        self._submit_prompt(message)  # ChatTurns

    @on(MessageAction)
    def _message_action(self, message: MessageAction) -> None:
        self.message_action(message)  # ChatMoves

    @on(EngineEvent)
    def _engine_event(self, message: EngineEvent) -> None:
        self._show_event(message.key, message.event)  # EngineEventView: one handler per type

    @on(TurnEnded)
    def _turn_ended(self, message: TurnEnded) -> None:
        self._end_turn(message.key, message.done)  # ChatTurns

    @on(Resumed)
    async def _resumed(self, message: Resumed) -> None:
        await self._show_resumed(message.key, message.error)  # ChatTurns

    @on(ConversationList.ChatChosen)
    def _chat_chosen(self, message: ConversationList.ChatChosen) -> None:
        entry = message.entry
        if entry.key is not None:
            self._switch(entry.key)
        elif entry.problem is not None:  # listed so it never vanishes silently; it cannot resume
            # A file of another model is fine: never advise deleting it.
            advice = "" if entry.other_model else " (delete it in the cache browser, F4)"
            self._toast(f"{one_line(entry.title, 60)}: cannot be resumed here: {entry.problem}{advice}",
                        "Saved session", "warning")
        elif entry.chat_id is not None:
            self._start_resume(entry.chat_id, how="stored")
        elif entry.sha is not None:
            self._start_resume(entry.sha, how="file")

    @on(ModelSwitched)
    async def _model_switched(self, message: ModelSwitched) -> None:
        await self._show_switched(message)  # ModelSwitch

    @on(ConversationList.DeleteRequested)
    def _delete_requested(self, message: ConversationList.DeleteRequested) -> None:
        entry = message.entry
        self._ask_delete(entry.title, key=entry.key, chat_id=entry.chat_id)  # ChatHistory

    def on_resize(self, event) -> None:
        self._fit_sidebar(event.size.width)  # ChatPanes

    def action_keys_help(self) -> None:
        from ds4tui.screens.keys_help import KeysHelpScreen

        if not isinstance(self.app.screen, KeysHelpScreen):
            self.app.push_screen(KeysHelpScreen())

    # -- quitting -----------------------------------------------------------------------------

    def save_and_exit(self) -> None:
        """Cancel what runs, save every live session (reason `shutdown`), then exit the app."""
        if self._quitting:
            return
        self._quitting = True
        self._start_cancel.set()  # a download in progress stops (pip is terminated) and leaves nothing
        if self.controller is None:
            self.app.exit()
            return
        self.controller.cancel()
        live = self.controller.live_count()
        if live:
            self.query_one(StatusBar).set_activity(None, f"saving {live} session(s)…")
        # Messages still queued behind another chat's reply: kept as their chats' drafts.
        self._shutdown([(key, waiting.text) for key, waiting in self._send_queue.clear()])

    @on(SessionsSaved)
    def _sessions_saved(self) -> None:
        self.app.exit()

    def on_unmount(self) -> None:
        # However the app ends, a turn still running in a worker thread stops at its
        # next chunk or token instead of holding the process open.
        if self.controller is not None:
            self.controller.cancel()

    def _model_ready_or_say(self) -> bool:
        """For a key pressed while the model loads (the first start converts a GGUF: 10-20 s):
        True when the controller exists, else a notice instead of a key that does nothing."""
        if self.controller is not None:
            return True
        if self._model_error is not None:
            self._toast(no_model_text(self._model_error), "Model", "warning")
        else:
            self._toast("The model is still loading.", "Model", "warning")
        return False

    def _start_card_shown(self) -> bool:
        """Whether the start card (the model loads, or failed to) is what the user sees now."""
        return bool(self.query_one(StartProgress).display) and self.app.screen is self

    def _toast(self, text: str, title: str, severity: str = "information") -> None:
        if self._start_card_shown():
            # The card answers itself: a toast at the top right would cover its title.
            self.query_one(StartProgress).say(safe_lines(text), severity)
            return
        # Toasts often quote a title or a reason read from a file: the one terminal-safety rule.
        self.notify(safe_lines(text), title=one_line(title), severity=severity, timeout=NOTIFY_TIMEOUT,
                    markup=False)
