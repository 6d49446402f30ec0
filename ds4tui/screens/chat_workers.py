"""The chat screen's worker threads: every call that may take the engine or read the disk.

Owns: `EngineWorkers`, mixed into `ChatScreen`: loading the model, generating a reply,
resuming a saved session, the shutdown saves (all in the `engine` group, one at a
time: `_begin_job` marks one running, `_idle` is set when it ends) and listing the
saved sessions for the sidebar. Each runs as `@work(thread=True)` and reports back
only through the screen's messages (`ModelReady`, `EngineEvent`, `TurnEnded`,
`Resumed`, `SessionsSaved`...) or `_call_from_thread`, never by touching widgets.
Leaves to `ChatScreen` and its other mixins what the messages do on screen.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from textual import work

from ds4tui.chat import events as ev
from ds4tui.chat.streaming import EventBatcher
from ds4tui.errors import error_line

if TYPE_CHECKING:
    from ds4tui.engine.model import Model

SHUTDOWN_WAIT_S = 30.0  # longest wait for a running turn at exit: one prefill chunk is far less


class EngineWorkers:
    """The `ChatScreen` workers and the bookkeeping of the one engine job at a time."""

    def _begin_job(self) -> None:
        self._engine_job = True
        self._idle.clear()

    def _end_job(self) -> None:
        """The engine job is over (on the UI thread): a message queued meanwhile goes next."""
        self._engine_job = False
        self.call_later(self._send_next_waiting)  # ChatTurns, once the caller's screen updates are in

    def _call_from_thread(self, callback, *args) -> None:
        """Run `callback` on the UI thread, unless the app is already gone (a worker outliving exit)."""
        try:
            self.app.call_from_thread(callback, *args)
        except RuntimeError:
            pass

    @work(thread=True, group="engine", description="load the model")
    def _load_model(self, spec: str) -> None:
        from ds4tui.chat.startup import ready_model

        last: list = [None]

        def report(step) -> None:
            # One message per percent of a step, not per block read or file compiled.
            key = (step.step, step.state, None if step.fraction is None else int(step.fraction * 100), step.detail)
            if key != last[0]:
                last[0] = key
                self.post_message(self.Starting(step))

        # No garbage collection while torch and the model load: they make ~200k objects that
        # live for the whole run, and the full collections they triggered scanned them again
        # and again (~0.2 s of the load). Once the model is ready the app freezes them out of
        # the collector's reach (app.py, _freeze_heap).
        gc.disable()
        try:
            model = ready_model(spec, report, self._start_cancel)
            self._make_controller(model)
            assert self.controller is not None
            # Probes the context size (may build a session) and pays the engine's first-use
            # costs (page faults, first library calls) here, not in the first message's TTFT.
            self.controller.warm_up()
        except Exception as exc:  # a bad file (Ds4tuiError: its message) or a loader bug: one line
            self.controller = None  # one that failed its warm-up is no controller to send to
            self.post_message(self.ModelFailed(error_line(exc)))
        else:
            self.post_message(self.ModelReady())
        finally:
            gc.enable()

    def _make_controller(self, model: Model) -> None:
        from ds4tui.chat.controller import ChatController

        self.controller = ChatController(model, self.config)

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

    @work(thread=True, group="engine", description="resume a saved session")
    def _resume_session(self, query: str, how: str) -> None:
        """how: "stored" (a chat id of the store), "file" (a .kv file's sha) or "query" (--resume)."""
        assert self.controller is not None
        sink = EventBatcher(lambda event: self.post_message(self.EngineEvent("", event)))
        try:
            if how == "stored":
                conv = self.controller.open_stored(query, sink)
            elif how == "file":
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

    @work(thread=True, group="shutdown", description="save live sessions")
    def _shutdown(self, drafts: list[tuple[str, str]] = ()) -> None:
        """drafts: (chat, text) of messages still queued, stored as those chats' drafts."""
        assert self.controller is not None
        # A running turn stops at its next chunk or token (cancelled by save_and_exit); wait
        # for it to hand its session back. Bounded, so a stuck engine cannot hang the exit.
        self._idle.wait(timeout=SHUTDOWN_WAIT_S)
        sink = EventBatcher(lambda event: self.post_message(self.EngineEvent("", event)))
        try:
            for key, text in drafts:
                self.controller.keep_draft(key, text)
            self.controller.shutdown(sink)
        except Exception as exc:  # exiting anyway; say what was not saved
            sink(ev.ChatError("shutdown", str(exc) or type(exc).__name__))
        finally:
            sink.flush()
            self.post_message(self.SessionsSaved())

    @work(thread=True, group="scan", exclusive=True, description="list saved chats")
    def _scan_saved(self) -> None:
        """The stored chats that are not open, each with whether its KV is still on disk
        (a file check per chat: never on the UI thread)."""
        assert self.controller is not None
        if not self._imported_history:
            # Once per start: chats of an older ds4tui (titled .kv files, remote transcripts).
            self._imported_history = True
            try:
                report = self.controller.import_existing()
            except Exception as exc:  # the import is a convenience: the chat goes on
                self._call_from_thread(self._toast, f"import of older chats failed: {exc}", "History", "warning")
            else:
                if report.imported or report.skipped or report.error:
                    severity = "warning" if report.skipped or report.error else "information"
                    self._call_from_thread(self._toast, f"Older chats: {report.summary()}", "History", severity)
        try:
            saved = [(chat, self.controller.kv_on_disk(chat)) for chat in self.controller.stored_chats()]
        except Exception:  # an unreadable store lists nothing; the chat goes on
            saved = []
        self._call_from_thread(self._saved_scanned, saved)

    @work(thread=True, group="engine", description="look for pinned files before a delete")
    def _count_pinned(self, key: str | None, chat_id: str | None, title: str) -> None:
        assert self.controller is not None
        try:
            pinned, error = self.controller.pinned_files(key, chat_id), None
        except Exception as exc:  # an unreadable cache or store: nothing is deleted
            pinned, error = 0, str(exc) or type(exc).__name__
        self._idle.set()
        self._call_from_thread(self._confirm_delete, key, chat_id, title, pinned, error)

    @work(thread=True, group="engine", description="delete a chat")
    def _delete_chat(self, key: str | None, chat_id: str | None, title: str) -> None:
        assert self.controller is not None
        try:
            files = self.controller.delete(key) if key is not None else self.controller.delete_stored(chat_id)
        except Exception as exc:  # StoreError, a busy chat: one line
            self._idle.set()
            self._call_from_thread(self._chat_deleted, key, title, None, str(exc) or type(exc).__name__)
        else:
            self._idle.set()
            self._call_from_thread(self._chat_deleted, key, title, files, None)
