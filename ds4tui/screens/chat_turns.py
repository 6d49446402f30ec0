"""The chat screen's side of a turn and of a resume: how each starts and how it ends on screen.

Owns: `ChatTurns`, mixed into `ChatScreen`: a submitted message (queued while the
model loads, queued while another engine job runs: send_queue.py, resent when
editing), the user and reply bubbles of a send, Escape (cancel this chat's work) and
ctrl+c (stop whatever runs; twice within a second quits), the end of a turn (a cancelled
or failed one withdraws its message and puts the text back in the prompt; a
regenerate that did not happen shows the old reply again), and opening a saved
session or a checkpoint file (the sidebar, the cache browser, `--resume`) up to
the toast that says it is back.
Leaves the work itself to the workers (chat_workers.py), and to `ChatScreen` the
`@on` handlers that call in here (`_submit`, `_turn_ended`, `_resumed`).
"""

from __future__ import annotations

from ds4tui.chat import events as ev
from ds4tui.screens.chat_moves import version_note
from ds4tui.screens.chat_notices import stats_line, stop_note
from ds4tui.screens.send_queue import waits_for
from ds4tui.screens.widgets import fmt
from ds4tui.screens.widgets.title_fit import short_title
from ds4tui.screens.widgets.chat_pane import ChatPane
from ds4tui.screens.widgets.prompt_input import PromptInput
from ds4tui.screens.widgets.status_bar import StatusBar


QUIT_WINDOW_S = 1.0  # a second ctrl+c within this quits


class ChatTurns:
    """The `ChatScreen` methods that start and finish sends and resumes."""

    # -- sending -------------------------------------------------------------------------------

    def _submit_prompt(self, message: PromptInput.Submitted) -> None:
        text = message.text
        if not text.strip():
            return
        status = self.query_one(StatusBar)
        if self.controller is None and self._model_error is not None:
            # Nothing would ever send it: it stays in the box, and the notice says why.
            self._model_ready_or_say()
            return
        if self.controller is None or self._active is None:
            if self._queued is not None:  # one waits already: this one stays in the box, never lost
                self._toast("A message is already waiting for the model; this one stays in the box"
                            " (Escape or ctrl+c takes that one back).", "Queued", "warning")
                return
            self._queued = text  # sent as soon as the model is ready
            message.prompt_input.clear()
            status.set_activity(None, "message queued: sent when the model is ready")
            return
        key = self._active
        editing = self._editing
        if self._engine_job:
            if editing is not None and editing[0] == key:
                self._toast(f"Wait: {self._job_text()} is still running (an edit resends when the engine is"
                            " free).", "Edit", "warning")
                return
            if self._busy == key:  # its own reply runs: a follow-up waits in the box, not in a queue
                self._toast("This chat is still answering: Escape stops it; your message stays in the box.",
                            "Busy", "warning")
                return
            if key in self._send_queue:
                self._toast("This chat already has a message waiting; this one stays in the box "
                            "(Escape takes the waiting one back).", "Queued", "warning")
                return
            self._queue_message(key, text)
            message.prompt_input.clear()
            return
        message.prompt_input.clear()
        self._editing = None
        if editing is not None and editing[0] == key:
            if text == self.controller.get(editing[0]).messages[editing[1]]["content"]:
                # Resending it as it was would only fork the chat: a stray `e`, Enter.
                status.set_activity(key, "")
                self._toast("The message is unchanged: nothing resent (ctrl+r samples the reply again).", "Edit")
                return
            self._resend_edited(editing[0], editing[1], text)
            return
        self._send(key, text)

    def _job_text(self) -> str:
        """The running engine job, named for a notice: "the reply in «Title»" or what runs."""
        if self._busy is not None:
            conv = self._conversation(self._busy)
            return f"the reply in «{short_title(conv.display_title)}»" if conv is not None else "a reply"
        work = self.query_one(StatusBar).activity_of(None).rstrip("…")
        return work or "an engine job"

    def _queue_message(self, key: str, text: str) -> None:
        """Show `text` in chat `key` now and send it when the running job ends (SendQueue)."""
        pane = self._pane(key)
        pane.follow()
        bubble = pane.log.add_user(text)
        self._send_queue.add(key, text, bubble)
        busy = self._conversation(self._busy) if self._busy is not None else None
        why = waits_for(busy.display_title if busy is not None else None, self._busy == key,
                        self.query_one(StatusBar).activity_of(None))
        self.query_one(StatusBar).set_activity(key, f"queued: {why}")
        self._toast(f"Queued: sent {why} (Escape here takes it back).", "Queued")

    def _send_next_waiting(self) -> None:
        """The engine is free: send the oldest queued message (its bubble is on screen)."""
        if self._engine_job or self._quitting or self.controller is None:
            return
        while True:
            item = self._send_queue.next()
            if item is None:
                return
            key, waiting = item
            if self._pane_or_none(key) is not None and self._conversation(key) is not None:
                self._send(key, waiting.text, shown=True)
                return

    def _take_back_queued(self) -> bool:
        """The message sent while the model loads goes back into the box (before what is typed
        there now); False when none waits."""
        if self._queued is None:
            return False
        text, self._queued = self._queued, None
        self.query_one(StatusBar).set_activity(None, "")  # "message queued: ..." is over
        prompt = self.query_one("#prompt", PromptInput)
        prompt.load_text(text + ("\n" + prompt.text if prompt.text else ""))
        prompt.move_cursor(prompt.document.end)
        return True

    def _take_back_waiting(self, key: str) -> bool:
        """Escape / ctrl+c in a chat whose message waits: it goes back into the box."""
        waiting = self._send_queue.take(key)
        if waiting is None:
            return False
        waiting.bubble.remove()
        self.query_one(StatusBar).set_activity(key, "")
        prompt = self.query_one("#prompt", PromptInput)
        if key == self._active:
            prompt.load_text(waiting.text + ("\n" + prompt.text if prompt.text else ""))
            prompt.move_cursor(prompt.document.end)
        self._toast("Not sent: the message is back in the box.", "Queued")
        return True

    def _send(self, key: str, text: str, *, shown: bool = False) -> None:
        pane = self._pane(key)
        pane.follow()  # sending means wanting to see the answer, wherever the view was
        if not shown:
            pane.log.add_user(text)
        pane.reply = pane.log.add_assistant()
        self._busy = key
        self._begin_job()
        self.query_one(StatusBar).set_activity(key, "prefilling…")
        self._refresh_sidebar()
        self._generate(key, text)

    def action_cancel(self) -> None:
        """Escape: stop this chat's running prefill or reply, or take its queued message back;
        else leave edit mode. Another chat's reply runs on (ctrl+c stops whatever runs)."""
        key = self._active
        if self._take_back_queued():
            self._toast("Not sent: the message is back in the box.", "Queued")
        elif key is not None and self._busy == key and self.controller is not None:
            self._stop_running()
        elif key is not None and self._take_back_waiting(key):
            pass
        elif self._stop_editing():  # ChatMoves
            self._toast("Edit cancelled; the chat is unchanged.", "Edit")
        elif self._busy is not None:
            self._toast(f"Nothing runs in this chat: {self._job_text()} runs on (Escape there, or ctrl+c"
                        " here, stops it).", "Cancel")

    def _stop_running(self) -> None:
        """Ask the running turn or move to stop (it ends through `_end_turn` as any turn does)."""
        assert self.controller is not None and self._busy is not None
        self.controller.cancel()
        self.query_one(StatusBar).set_activity(self._busy, "cancelling…")

    def interrupt(self) -> None:
        """ctrl+c, on any screen, with no text selected (app.py copies a selection first): stop
        what runs (this chat's queued message first, else the running reply or prefill,
        whichever chat it is in); a second ctrl+c within a second quits (save first, as ctrl+q)."""
        import time

        now = time.monotonic()
        again = now - self._last_interrupt <= QUIT_WINDOW_S
        self._last_interrupt = now
        if again:
            self.save_and_exit()
            return
        key = self._active
        if self._take_back_queued():  # sent while the model loads
            self._toast("Not sent: the message is back in the box. ctrl+c again within a second quits.", "Queued")
            return
        if key is not None and self._take_back_waiting(key):
            return
        if self._busy is not None and self.controller is not None:
            where = "" if self._busy == key else f" in «{short_title(self._conversation(self._busy).display_title)}»"
            self._stop_running()
            self._toast(f"Stopping the reply{where}. ctrl+c again within a second quits.", "Stop")
            return
        self._toast("Nothing to stop. ctrl+c again within a second quits (ctrl+q too).", "Quit?")

    def _end_turn(self, key: str, done: ev.Done | None) -> None:
        """A send finished (`done` is None when it was cancelled in prefill or failed)."""
        self._busy = None
        status = self.query_one(StatusBar)
        status.set_activity(key, "")
        if self.controller is not None:
            status.model_name = self.controller.model_name  # a remote engine names its model on first use
        pane = self._pane_or_none(key)
        if pane is not None:
            pane.prefill.hide()
            conv = self._conversation(key)
            if pane.reply is not None:
                pane.reply.finish()  # the block it was writing becomes Markdown too
            if done is None and pane.reply is not None:
                shown = len(pane.log.query("UserMessage"))
                kept = sum(1 for m in conv.messages if m.get("role") == "user") if conv is not None else 0
                if shown > kept or conv is None or not conv.messages or conv.messages[-1].get("role") != "assistant":
                    # Cancelled in prefill or failed: the controller withdrew the user message
                    # (the screen still shows it; the chat's earlier replies are not this turn's).
                    self._withdraw_turn(pane)
                else:
                    # A regenerate that did not happen: the old reply is back.
                    self._show_reply(pane.reply, conv.messages[-1]["content"])
            if done is not None and done.regenerated and pane.reply is not None and conv is not None:
                # The earlier replies are versions of this one: say so, and how to see them.
                shown, count = conv.alternative_index(len(conv.messages) - 1)
                if count > 1:
                    pane.reply.set_stats(f"{stats_line(done)} · {version_note(shown, count)}")
            pane.reply = None
        self._refresh_sidebar()
        self._update_context()
        self._end_job()  # after the withdrawal: a queued message of this chat may go next

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

    # -- resuming ------------------------------------------------------------------------------

    def open_file(self, sha: str) -> None:
        """Open one checkpoint file (titled or not) as a chat: the cache browser's resume."""
        if not self._model_ready_or_say():
            return
        self._start_resume(sha, how="file")

    def _start_resume(self, query: str, how: str = "query") -> None:
        if self._engine_job:
            self.notify("Wait for the reply to finish (Escape cancels it).", severity="warning", markup=False)
            return
        self._begin_job()
        self.query_one(StatusBar).set_activity(None, "resuming…")
        self._resume_session(query, how)

    async def _show_resumed(self, key: str | None, error: str | None) -> None:
        """A resume ended: its chat on screen (a pane of its own if new), or the error."""
        self._end_job()
        self.query_one(StatusBar).set_activity(None, "")
        if error is not None or key is None:
            self.notify(error or "not resumed", title="Resume", severity="error", markup=False)
            if self._active is None:
                await self.action_new_chat()
            return
        conv = self._conversation(key)
        assert conv is not None
        pane = self._pane_or_none(conv.key)
        already_open = pane is not None
        if pane is None:
            pane = await self._add_pane(conv.key)
            # A reply cut off before the app quit is marked as the live chat marked it.
            pane.log.show_messages(self._shown(conv.visible_messages()),
                                   stop_note(conv.resumed_stop) or "" if conv.resumed_stop else "",
                                   version_notes(conv))
        self.query_one(StatusBar).adopt(conv.key)  # the resume's disk hit, reported before the chat existed
        self._switch(conv.key)
        self._scan_saved()
        if already_open:  # found again (ctrl+f, the browser): nothing was loaded
            self._toast(f"{short_title(conv.display_title)} is already open: shown", "Session")
            return
        if conv.draft:  # a message from before the app stopped, never answered: back in the box
            prompt = self.query_one("#prompt", PromptInput)
            if not prompt.text:
                prompt.load_text(conv.draft)
                prompt.move_cursor(prompt.document.end)
            conv.draft = None
        on_server = self.controller.model_info is None  # the backend contract: None on a remote engine
        self._toast(resumed_text(conv, self._opened.pop(conv.key, None), self._prefill_tok_s, on_server),
                    "Session")


def resumed_text(conv, opened: ev.HistoryOpened | None, prefill_tok_s: float | None,
                 on_server: bool = False) -> str:
    """The toast of a chat opened from the store: restored from its KV, or from its text only
    (what the next message will re-prefill, and about how long that takes here). `on_server`:
    the chat runs on a remote engine, which keeps no KV here (whatever made the chat)."""
    title = short_title(conv.display_title)
    if on_server:
        shown = len(conv.visible_messages())
        return (f"Resumed {title} ({shown} message{'s' if shown != 1 else ''}): the server re-reads its history"
                " at the next message")
    if conv.live:
        return f"Resumed {title} ({fmt.tokens(conv.context_tokens)} tokens restored, no prefill)"
    if opened is None:
        return f"Resumed {title}: its history is kept; the next message prefills it"
    cost = f"re-prefill {fmt.tokens(opened.prefill_tokens)} tok"
    if prefill_tok_s:
        cost += f" ~ {opened.prefill_tokens / prefill_tok_s:.1f} s"
    if opened.made_with:
        return f"Resumed {title}: made with {opened.made_with}; continuing here will {cost}"
    if opened.kv_problem:
        return f"Resumed {title}: {opened.kv_problem}; history kept: {cost} at the next message"
    return f"Resumed {title}: history kept, KV evicted: {cost} at the next message"


def version_notes(conv) -> dict[int, str]:
    """Visible-message index -> where that reply stands among its versions (kept in the store)."""
    notes = {}
    visible = [i for i, m in enumerate(conv.messages) if m.get("role") in ("user", "assistant")]
    for shown_at, index in enumerate(visible):
        if index in conv.alternatives:
            notes[shown_at] = version_note(*conv.alternative_index(index))
    return notes
