"""The chat screen: conversations in a sidebar, the active one in the middle, a prompt below.

Owns: turning user intents (send, cancel, new, switch, resume, quit) into
controller calls on worker threads, the screen's messages, and the sidebar.
Beside it: chat_events.py shows the controller's events (streamed Markdown,
the prefill bar, the status bar, notifications; one handler per event type),
chat_dialogs.py opens rename, settings and the cache browser.
The engine never runs on the UI thread: model loading, every turn, resuming
and the shutdown saves are `@work(thread=True)` workers that report back
through this screen's messages. One engine job runs at a time (the CPU has
no room for two); switching chats, typing and scrolling stay live meanwhile.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, LoadingIndicator

from ds4tui.chat import events as ev
from ds4tui.chat.streaming import EventBatcher
from ds4tui.config import Config
from ds4tui.format.display import one_line
from ds4tui.screens.chat_dialogs import ChatDialogs
from ds4tui.screens.chat_events import EngineEventView
from ds4tui.screens.chat_moves import ChatMoves, ChatMovesPalette
from ds4tui.screens.widgets.chat_log import MessageAction
from ds4tui.screens.widgets import fmt
from ds4tui.screens.widgets.chat_pane import ChatPane
from ds4tui.screens.widgets.conversation_list import ChatEntry, ConversationList
from ds4tui.screens.widgets.prompt_input import PromptInput
from ds4tui.screens.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from ds4tui.chat.controller import ChatController
    from ds4tui.engine.model import Model

SIDEBAR_HIDE_BELOW = 60  # columns: narrower, the transcript needs them all


def preparing_text(what: str, fraction: float) -> str:
    """The status line while a model is converted for fast loading, the first time only."""
    return f"preparing {what} for fast loading (once) … {fraction:.0%}"


def sidebar_width(columns: int) -> int:
    return max(20, min(48, int(columns * 0.3)))


NOTIFY_TIMEOUT = 4.0  # seconds a cache toast stays up: long enough to read one line
SHUTDOWN_WAIT_S = 30.0  # longest wait for a running turn at exit: one prefill chunk is far less


class ChatScreen(EngineEventView, ChatDialogs, ChatMoves, ChatMovesPalette, Screen):
    """The whole chat UI; the app's default screen."""

    BINDINGS = [
        # Short labels: the footer holds them all at 80 columns (the palette has the long names).
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
    | ctrl+n | Start a new chat. |
    | f2 | Rename the active chat. |
    | escape | Cancel the running prefill or reply. |
    | f3 | Sampling settings and system prompt. |
    | f4 | Open the cache browser. |
    | ctrl+b | Show or hide the chat list. |
    | ctrl+r | Regenerate the last reply (the old one stays: ←/→ on it). |
    | ctrl+f | Find a chat: titles and transcripts of every saved session. |
    | tab, then e / f / y / ← → | On a selected message: edit and resend, fork, copy, versions. |
    | ctrl+pageup / ctrl+pagedown | Previous / next open chat. |
    | pageup / pagedown | Scroll the transcript, from the message box too. |
    """

    # -- messages (posted by workers, bubbling to the app so tests can watch them) -----------

    @dataclass
    class ModelReady(Message):
        """The model is loaded and the controller exists."""

    @dataclass
    class Preparing(Message):
        """The model's one-time preparation (a GGUF's conversion) is `fraction` done."""

        what: str
        fraction: float

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

    def __init__(self, config: Config, *, model: Model | None = None, controller: ChatController | None = None,
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
        self._last_speed = ""
        self._cache_lines: dict[str, str] = {}  # chat key -> its last cache event (status bar)
        self._event_key = ""  # the chat of the event being shown
        self._prefill_tok_s: float | None = None  # measured on the last long prefill (browser's resume cost)
        self._quitting = False
        self._queued: str | None = None  # a message sent while the model loads
        self._sidebar_folded = False  # folded once for a narrow terminal; ctrl+b still toggles
        self._saved: list = []  # titled sessions on disk, as last scanned (off the UI thread)
        # Set while no engine job runs; the shutdown worker waits on it.
        self._idle = threading.Event()
        self._idle.set()

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield ConversationList(id="sidebar")
            with Vertical(id="main"):
                yield LoadingIndicator(id="loading")
                yield ContentSwitcher(id="chats")
                yield PromptInput(id="prompt", placeholder="Message · Enter sends · ctrl+j new line",
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
            # (docs/perf.md, "Start-up").
            self.call_after_refresh(self._load_model, self.config.model)

    # -- model loading -------------------------------------------------------------------------

    @work(thread=True, group="engine", description="load the model")
    def _load_model(self, spec: str) -> None:
        from ds4tui.engine.loader import load_model
        from ds4tui.engine.errors import EngineError

        last = [-1]

        def progress(what: str, fraction: float) -> None:
            percent = int(fraction * 100)
            if percent != last[0]:  # one message per percent, not per step
                last[0] = percent
                self.post_message(self.Preparing(what, fraction))

        try:
            model = load_model(spec, progress=progress)
            self._make_controller(model)
            assert self.controller is not None
            # Probes the context size (may build a session) and pays the engine's first-use
            # costs (page faults, first library calls) here, not in the first message's TTFT.
            self.controller.warm_up()
        except EngineError as exc:
            self.post_message(self.ModelFailed(str(exc)))
        except Exception as exc:  # a loader bug is shown, never a traceback
            self.post_message(self.ModelFailed(f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.ModelReady())

    def _make_controller(self, model: Model) -> None:
        from ds4tui.chat.controller import ChatController

        self.controller = ChatController(model, self.config)

    @on(ModelReady)
    async def _model_ready(self) -> None:
        self.query_one("#loading").display = False
        status = self.query_one(StatusBar)
        assert self.controller is not None
        status.model_name = self.controller.model_name
        status.ctx_total = self.controller.ctx_size()
        if self.controller.disk_cache_notice:  # the chat goes on without the disk cache
            self._toast(self.controller.disk_cache_notice, "Disk cache", "warning")
        self._scan_saved()
        if self._resume:
            self._start_resume(self._resume)
        elif self._imported:
            imp = self._imported
            conv = self.controller.import_messages(imp["messages"], imp.get("title"), imp.get("created_at"))
            pane = await self._add_pane(conv.key)
            pane.log.show_messages(conv.visible_messages())
            self._switch(conv.key)
        else:
            await self.action_new_chat()
        if self._queued is not None and self._active is not None:
            text, self._queued = self._queued, None
            self._send(self._active, text)

    @on(Preparing)
    def _preparing(self, message: Preparing) -> None:
        self.query_one(StatusBar).model_name = preparing_text(message.what, message.fraction)

    @on(ModelFailed)
    def _model_failed(self, message: ModelFailed) -> None:
        self.query_one("#loading").display = False
        self.query_one(StatusBar).model_name = "no model"
        pane_log = self.query_one("#main")
        from ds4tui.screens.widgets.chat_log import NoticeLine

        pane_log.mount(NoticeLine(f"Could not load the model: {message.error}", error=True), before=0)
        self.notify(message.error, title="Model not loaded", severity="error", markup=False, timeout=10)

    # -- sending -------------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    def _submit(self, message: PromptInput.Submitted) -> None:
        text = message.text
        if not text.strip():
            return
        if self.controller is None or self._active is None:
            self._queued = text  # sent as soon as the model is ready
            message.prompt_input.clear()
            self.query_one(StatusBar).activity = "message queued: sent when the model is ready"
            return
        if self._engine_job:
            self.notify("Still working on the last reply (Escape cancels it).", severity="warning", markup=False)
            return
        message.prompt_input.clear()
        editing, self._editing = self._editing, None
        if editing is not None and editing[0] == self._active:
            self._resend_edited(editing[0], editing[1], text)
            return
        self._send(self._active, text)

    def _send(self, key: str, text: str) -> None:
        pane = self._pane(key)
        pane.follow()  # sending means wanting to see the answer, wherever the view was
        pane.log.add_user(text)
        pane.reply = pane.log.add_assistant()
        self._busy = key
        self._begin_job()
        self.query_one(StatusBar).activity = "prefilling…"
        self._refresh_sidebar()
        self._generate(key, text)

    @work(thread=True, group="engine", description="generate a reply")
    def _generate(self, key: str, text: str) -> None:
        assert self.controller is not None
        sink = EventBatcher(lambda event: self.post_message(self.EngineEvent(key, event)))
        done = None
        try:
            done = self.controller.send(key, text, sink)
        except Exception as exc:  # a controller bug: shown, never a traceback
            sink(ev.ChatError("generate", f"{type(exc).__name__}: {exc}"))
        finally:
            sink.flush()
            self._idle.set()
            self.post_message(self.TurnEnded(key, done))

    @on(MessageAction)
    def _message_action(self, message: MessageAction) -> None:
        self.message_action(message)  # ChatMoves

    @on(EngineEvent)
    def _engine_event(self, message: EngineEvent) -> None:
        self._show_event(message.key, message.event)  # EngineEventView: one handler per type

    @on(TurnEnded)
    def _turn_ended(self, message: TurnEnded) -> None:
        self._busy = None
        self._engine_job = False
        status = self.query_one(StatusBar)
        status.activity = ""
        if self.controller is not None:
            status.model_name = self.controller.model_name  # a remote engine names its model on first use
        pane = self._pane_or_none(message.key)
        if pane is not None:
            pane.prefill.hide()
            conv = self._conversation(message.key)
            if message.done is None and pane.reply is not None:
                shown = len(pane.log.query("UserMessage"))
                kept = sum(1 for m in conv.messages if m.get("role") == "user") if conv is not None else 0
                if shown > kept or conv is None or not conv.messages or conv.messages[-1].get("role") != "assistant":
                    # Cancelled in prefill or failed: the controller withdrew the user message
                    # (the screen still shows it; the chat's earlier replies are not this turn's).
                    self._withdraw_turn(pane)
                else:
                    # A regenerate that did not happen: the old reply is back.
                    pane.reply.set_text(conv.messages[-1]["content"])
            pane.reply = None
        self._refresh_sidebar()
        self._update_context()

    def _withdraw_turn(self, pane: ChatPane) -> None:
        """Remove the unanswered exchange; put the text back in the prompt if it is empty."""
        reply = pane.reply
        assert reply is not None
        users = pane.log.query("UserMessage")
        text = users.last().text if users else ""
        if users:
            users.last().remove()
        reply.remove()
        prompt = self.query_one("#prompt", PromptInput)
        if pane.key == self._active and not prompt.text:
            prompt.load_text(text)
            prompt.move_cursor(prompt.document.end)

    def action_cancel(self) -> None:
        """Escape: stop the running prefill or reply."""
        if self._busy is not None and self.controller is not None:
            self.controller.cancel()
            self.query_one(StatusBar).activity = "cancelling…"

    # -- conversations ----------------------------------------------------------------------------

    async def action_new_chat(self) -> None:
        if self.controller is None:
            return
        conv = self.controller.new_conversation()
        await self._add_pane(conv.key)
        self._switch(conv.key)

    async def _add_pane(self, key: str) -> ChatPane:
        pane = ChatPane(key)
        await self.query_one(ContentSwitcher).add_content(pane)
        return pane

    def _switch(self, key: str) -> None:
        self._active = key
        self.query_one(ContentSwitcher).current = f"pane-{key}"
        conv = self._conversation(key)
        if conv is not None:
            conv.touch()
        self.query_one(StatusBar).cache = self._cache_lines.get(key, "")
        self._refresh_sidebar()
        self._update_context()
        self.query_one("#prompt", PromptInput).focus()

    def action_cycle_chat(self, step: int) -> None:
        if self.controller is None or self._active is None:
            return
        keys = [c.key for c in self.controller.list()]
        if len(keys) > 1:
            self._switch(keys[(keys.index(self._active) + step) % len(keys)])

    def on_resize(self, event) -> None:
        """The chat list takes 30% of the width (20..48 columns), so titles use what the
        terminal has; below 60 columns it folds away (ctrl+b shows it)."""
        sidebar = self.query_one(ConversationList)
        width = event.size.width
        sidebar.styles.width = sidebar_width(width)
        if width < SIDEBAR_HIDE_BELOW and not self._sidebar_folded:
            self._sidebar_folded = True
            sidebar.display = False

    def action_scroll_transcript(self, pages: int) -> None:
        """PageUp/PageDown: scroll the active chat's transcript, wherever the focus is."""
        pane = self._pane_or_none(self._active) if self._active else None
        if pane is None:
            return
        if pages < 0:
            pane.log.scroll_page_up(animate=False)
        else:
            pane.log.scroll_page_down(animate=False)

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(ConversationList)
        sidebar.display = not sidebar.display

    @on(ConversationList.ChatChosen)
    def _chat_chosen(self, message: ConversationList.ChatChosen) -> None:
        entry = message.entry
        if entry.key is not None:
            self._switch(entry.key)
        elif entry.problem is not None:  # listed so it never vanishes silently; it cannot resume
            self._toast(f"{entry.title}: cannot be resumed: {entry.problem} (delete it in the cache browser, F4)",
                        "Saved session", "warning")
        elif entry.sha is not None:
            self._start_resume(entry.sha, exact=True)

    def open_file(self, sha: str) -> None:
        """Open one checkpoint file (titled or not) as a chat: the cache browser's resume."""
        if self.controller is None:
            self.notify("The model is still loading.", severity="warning", markup=False)
            return
        self._start_resume(sha, exact=True)

    def _start_resume(self, query: str, exact: bool = False) -> None:
        if self._engine_job:
            self.notify("Wait for the reply to finish (Escape cancels it).", severity="warning", markup=False)
            return
        self._begin_job()
        self.query_one(StatusBar).activity = "resuming…"
        self._resume_session(query, exact)

    @work(thread=True, group="engine", description="resume a saved session")
    def _resume_session(self, query: str, exact: bool) -> None:
        assert self.controller is not None
        sink = EventBatcher(lambda event: self.post_message(self.EngineEvent("", event)))
        try:
            if exact:
                conv = self.controller.open_file(query, sink)
            else:
                conv = self.controller.resume(query, sink)
        except Exception as exc:  # LookupError, EngineError, or a bug: all shown as one line
            sink.flush()
            self._idle.set()
            self.post_message(self.Resumed(None, str(exc) or type(exc).__name__))
        else:
            sink.flush()
            self._idle.set()
            self.post_message(self.Resumed(conv.key))

    @on(Resumed)
    async def _resumed(self, message: Resumed) -> None:
        self._engine_job = False
        self.query_one(StatusBar).activity = ""
        if message.error is not None or message.key is None:
            self.notify(message.error or "not resumed", title="Resume", severity="error", markup=False)
            if self._active is None:
                await self.action_new_chat()
            return
        conv = self._conversation(message.key)
        assert conv is not None
        pane = self._pane_or_none(conv.key)
        if pane is None:
            pane = await self._add_pane(conv.key)
            pane.log.show_messages(conv.visible_messages())
        if "" in self._cache_lines:  # the resume's disk hit, reported before the chat existed
            self._cache_lines[conv.key] = self._cache_lines.pop("")
        self._switch(conv.key)
        self._scan_saved()
        self._toast(f"Resumed {one_line(conv.display_title, 39)} ({fmt.tokens(conv.context_tokens)} tokens,"
                    " no prefill)", "Session")

    # -- quitting -----------------------------------------------------------------------------

    def save_and_exit(self) -> None:
        """Cancel what runs, save every live session (reason `shutdown`), then exit the app."""
        if self._quitting:
            return
        self._quitting = True
        if self.controller is None:
            self.app.exit()
            return
        self.controller.cancel()
        live = self.controller.live_count()
        if live:
            self.query_one(StatusBar).activity = f"saving {live} session(s)…"
        self._shutdown()

    @work(thread=True, group="shutdown", description="save live sessions")
    def _shutdown(self) -> None:
        assert self.controller is not None
        # A running turn stops at its next chunk or token (cancelled above); wait for it
        # to hand its session back. Bounded, so a stuck engine cannot hang the exit.
        self._idle.wait(timeout=SHUTDOWN_WAIT_S)
        sink = EventBatcher(lambda event: self.post_message(self.EngineEvent("", event)))
        try:
            self.controller.shutdown(sink)
        except Exception as exc:  # exiting anyway; say what was not saved
            sink(ev.ChatError("shutdown", str(exc) or type(exc).__name__))
        finally:
            sink.flush()
            self.post_message(self.SessionsSaved())

    @on(SessionsSaved)
    def _sessions_saved(self) -> None:
        self.app.exit()

    def on_unmount(self) -> None:
        # However the app ends, a turn still running in a worker thread stops at its
        # next chunk or token instead of holding the process open.
        if self.controller is not None:
            self.controller.cancel()

    # -- helpers ----------------------------------------------------------------------------------

    def _pane(self, key: str) -> ChatPane:
        return self.query_one(f"#pane-{key}", ChatPane)

    def _pane_or_none(self, key: str) -> ChatPane | None:
        found = self.query(f"#pane-{key}") if key else None
        return found.first(ChatPane) if found else None

    def _conversation(self, key: str):
        if self.controller is None:
            return None
        return self.controller.find(key)

    def _toast(self, text: str, title: str, severity: str = "information") -> None:
        self.notify(text, title=title, severity=severity, timeout=NOTIFY_TIMEOUT, markup=False)

    def _update_context(self) -> None:
        status = self.query_one(StatusBar)
        conv = self._conversation(self._active) if self._active else None
        status.ctx_used = conv.context_tokens if conv is not None else 0
        if self.controller is not None:
            status.ctx_total = self.controller.ctx_size()

    def _call_from_thread(self, callback, *args) -> None:
        """Run `callback` on the UI thread, unless the app is already gone (a worker outliving exit)."""
        try:
            self.app.call_from_thread(callback, *args)
        except RuntimeError:
            pass

    def _begin_job(self) -> None:
        self._engine_job = True
        self._idle.clear()

    def _refresh_sidebar(self) -> None:
        """Redraw the chat list from memory (open chats) and the last disk scan (saved ones)."""
        if self.controller is None or self._quitting:
            return
        entries = [ChatEntry(c.display_title, key=c.key, live=c.live, busy=c.key == self._busy)
                   for c in self.controller.list()]
        open_shas = {c.saved_sha for c in self.controller.list() if c.saved_sha}
        entries += [ChatEntry(s.title, sha=s.sha, problem=s.problem) for s in self._saved if s.sha not in open_shas]
        # exit_on_error=False: a redraw racing the app's exit must not end in a traceback.
        self.run_worker(self.query_one(ConversationList).show_entries(entries, self._active),
                        group="sidebar", exclusive=False, exit_on_error=False)

    @work(thread=True, group="scan", exclusive=True, description="list saved sessions")
    def _scan_saved(self) -> None:
        """Read the titled sessions on disk (deep inspection reads files: never on the UI thread)."""
        assert self.controller is not None
        try:
            saved = self.controller.saved_sessions(with_problems=True)
        except Exception:  # an unreadable directory lists nothing; the chat goes on
            saved = []
        self._call_from_thread(self._saved_scanned, saved)

    def _saved_scanned(self, saved: list) -> None:
        self._saved = saved
        self._refresh_sidebar()
