"""The conversation moves on screen: regenerate (ctrl+r), a reply's versions (←/→), edit and
resend (`e` on a selected user message), fork (`f`), copy (`y`, `c` a code block), a
message's menu (Enter, a right-click, its ⋯), find a chat (ctrl+f), and the full-context choices.

Owns: `ChatMoves`, mixed into `ChatScreen`: what each key does to the chat's pane and
which controller call it runs on the engine worker (the turn's events stream into the
pane as a normal reply's do). Leaves the moves themselves to the controller (chat/moves.py).
Messages are selected by focus (Tab, or a click); the message widgets own their keys and
post `MessageAction`, as does their menu (widgets/message_menu.py), which the screen hands
to `message_action` here.
"""

from __future__ import annotations

from textual import work

from ds4tui.chat import events as ev
from ds4tui.chat.streaming import EventBatcher
from ds4tui.screens.widgets import fmt
from ds4tui.screens.widgets.title_fit import short_title
from ds4tui.screens.widgets.chat_log import AssistantMessage, MessageAction
from ds4tui.screens.widgets.markdown_blocks import code_blocks
from ds4tui.screens.widgets.prompt_input import PromptInput
from ds4tui.screens.widgets.status_bar import StatusBar


EDITING = "editing: Enter resends, Esc cancels"  # the status bar while a message is being edited


def version_note(shown: int, count: int) -> str:
    """Where a reply stands among its versions, and how to switch (select it, then ←/→)."""
    return f"version {shown + 1}/{count} · shift+tab, then ←/→ switches"


class ChatMoves:
    """The `ChatScreen` side of regenerate, versions, edit, fork, copy, find and a full context."""

    _editing: tuple[str, int] | None = None  # (chat, message index) the next Enter resends

    # -- which message --------------------------------------------------------------------------

    def _message_index(self, widget) -> int | None:
        """conv.messages index of a message widget of the active pane."""
        if self.controller is None or self._active is None:
            return None
        conv = self.controller.get(self._active)
        shown = self._pane(self._active).log.messages()
        if widget not in shown:
            return None
        real = [i for i, m in enumerate(conv.messages) if m.get("role") in ("user", "assistant")]
        pos = shown.index(widget)
        return real[pos] if pos < len(real) else None

    def message_action(self, message: MessageAction) -> None:
        index = self._message_index(message.widget)
        if index is None or self.controller is None or self._active is None:
            return
        conv = self.controller.get(self._active)
        text = conv.messages[index]["content"]
        role = conv.messages[index]["role"]
        action = message.action
        if action == "menu":
            self._open_menu(message.widget, self._menu_items(index), "reply" if role == "assistant" else "message")
        elif action == "copy":
            self._copy(text, "the reply" if role == "assistant" else "the message")
        elif action == "code" or action.startswith("code:"):
            self._copy_code(message.widget, text, action)
        elif action == "edit" and role == "user":
            self._start_editing(index, text)
        elif action == "fork":
            upto = index + 1 if role == "assistant" else index  # at a question: before it, text in the prompt
            self._start_fork(self._active, upto, text if role == "user" else None)
        elif action == "regenerate":
            self.action_regenerate()
        elif action in ("prev", "next"):
            self._switch_version(index, message.widget, -1 if action == "prev" else 1)
        elif action == "delete-version":
            self._ask_delete_version(index, message.widget)

    def _menu_items(self, index: int) -> list[tuple[str, str, str]]:
        """(action, label, key) of what the message at `index` offers now."""
        conv = self.controller.get(self._active)
        if conv.messages[index]["role"] == "user":
            return [("copy", "Copy message", "y"), ("edit", "Edit and resend", "e"),
                    ("fork", "Fork: new chat from here", "f")]
        blocks = code_blocks(conv.messages[index]["content"])
        items = [("copy", "Copy reply", "y")]
        items += [(f"code:{i}", f"Copy code {i + 1}: {b.label}", "c" if len(blocks) == 1 else "")
                  for i, b in enumerate(blocks)]
        items.append(("fork", "Fork: new chat up to here", "f"))
        if index == len(conv.messages) - 1:
            items.append(("regenerate", "Regenerate", "ctrl+r"))
            shown, count = self.controller.alternatives(self._active, index)
            if count > 1:
                items += [("prev", f"Previous version ({shown + 1}/{count})", "←"),
                          ("next", "Next version", "→"), ("delete-version", "Delete this version", "")]
        return items

    def _open_menu(self, widget, items: list[tuple[str, str, str]], title: str) -> None:
        from ds4tui.screens.widgets.message_menu import MessageMenu

        for old in self.query(MessageMenu):
            old.discard()
        self.mount(MessageMenu(widget, items, title=title))

    def _copy(self, text: str, what: str) -> None:
        from ds4tui.screens.clipboard import copy_text

        done = copy_text(text, what, self.app.copy_to_clipboard)
        self._toast(done.message, "Clipboard", done.severity)

    def _copy_code(self, widget, text: str, action: str) -> None:
        """`c`: the reply's one code block, or a menu of them; "code:N": block N."""
        blocks = code_blocks(text)
        if not blocks:
            self._toast("This reply has no code block.", "Clipboard", "warning")
        elif action.startswith("code:"):
            n = int(action.split(":", 1)[1])
            if 0 <= n < len(blocks):
                self._copy(blocks[n].code, f"code block {n + 1}" if len(blocks) > 1 else "the code block")
        elif len(blocks) == 1:
            self._copy(blocks[0].code, "the code block")
        else:
            self._open_menu(widget, [(f"code:{i}", f"Copy code {i + 1}: {b.label}", str(i + 1) if i < 9 else "")
                                     for i, b in enumerate(blocks)], "copy which block?")

    def _start_editing(self, index: int, text: str) -> None:
        if self._engine_job:
            self._toast("Wait for the reply to finish (Escape cancels it).", "Edit", "warning")
            return
        self._editing = (self._active, index)
        prompt = self.query_one("#prompt", PromptInput)
        prompt.load_text(text)
        prompt.move_cursor(prompt.document.end)
        prompt.focus()
        self.query_one(StatusBar).set_activity(self._active, EDITING)
        self._toast("Enter resends the edited message; the chat as it is now is kept as a fork. "
                    "Escape cancels the edit.", "Edit")

    def _stop_editing(self) -> bool:
        """Leave edit mode (Escape, or another chat shown): the box empties. False when not editing."""
        if self._editing is None:
            return False
        self._editing = None
        self.query_one("#prompt", PromptInput).clear()
        status = self.query_one(StatusBar)
        for key in (self._active,) if self._active is not None else ():
            if status.activity_of(key) == EDITING:
                status.set_activity(key, "")
        return True

    def _switch_version(self, index: int, widget, step: int) -> None:
        if self._engine_job or self._active is None:
            return
        try:
            text = self.controller.show_alternative(self._active, index, step)
        except ValueError as exc:
            self._toast(str(exc), "Versions", "warning")
            return
        shown, count = self.controller.alternatives(self._active, index)
        if isinstance(widget, AssistantMessage):
            self._show_reply(widget, text)
            widget.set_stats(version_note(shown, count))

    def _ask_delete_version(self, index: int, widget) -> None:
        """The menu's "Delete this version": asked first (it goes from the store too)."""
        from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog

        if self._engine_job or self._active is None:
            self._toast("Wait for the reply to finish (Escape cancels it).", "Versions", "warning")
            return
        key = self._active
        shown, count = self.controller.alternatives(key, index)

        def answered(yes: bool | None) -> None:
            if not yes or self._conversation(key) is None:
                return
            try:
                text = self.controller.delete_version(key, index)
            except (ValueError, RuntimeError) as exc:
                self._toast(str(exc), "Versions", "warning")
                return
            now, left = self.controller.alternatives(key, index)
            if isinstance(widget, AssistantMessage) and widget.is_mounted:
                widget.set_text(text)
                widget.set_stats(version_note(now, left) if left > 1 else "")
            self._toast(f"Deleted version {shown + 1} of {count}; showing version {now + 1} of {left}.", "Versions")

        self.app.push_screen(ConfirmDialog(f"Delete version {shown + 1} of {count} of this reply? It goes from the "
                                           "history for good; the other versions stay.", yes_label="Delete"),
                             answered)

    def action_model_info(self) -> None:
        """The palette's model line: what `ds4tui models info` prints."""
        if self.controller is None:
            self._toast("The model is still loading.", "Model")
            return
        self._toast(self.controller.model_description(), "Model")

    # -- regenerate and edit ------------------------------------------------------------------------

    def action_regenerate(self) -> None:
        """ctrl+r: sample the last reply again (the old one stays as a version)."""
        if not self._model_ready_or_say() or self._active is None:
            return
        if self._engine_job:
            self._toast("Wait for the reply to finish (Escape cancels it).", "Regenerate", "warning")
            return
        key = self._active
        conv = self.controller.get(key)
        if not conv.messages or conv.messages[-1].get("role") != "assistant":
            self._toast("Nothing to regenerate yet.", "Regenerate", "warning")
            return
        pane = self._pane(key)
        last = pane.log.last_assistant
        if last is not None:
            last.remove()
        pane.reply = pane.log.add_assistant()
        self._start_move(key, "regenerating…", lambda sink: self.controller.regenerate(key, sink))

    def _resend_edited(self, key: str, index: int, text: str) -> None:
        pane = self._pane(key)
        shown = pane.log.messages()
        visible = self._visible_position(key, index)
        for widget in shown[visible:]:
            widget.remove()
        pane.log.add_user(text)
        pane.reply = pane.log.add_assistant()

        def run(sink):
            done, fork = self.controller.edit(key, index, text, sink)
            if fork is not None:
                self._call_from_thread(self._fork_ready, fork.key, None, False)
            return done

        self._start_move(key, "prefilling the edit…", run)

    def _visible_position(self, key: str, index: int) -> int:
        conv = self.controller.get(key)
        return sum(1 for m in conv.messages[:index] if m.get("role") in ("user", "assistant"))

    def _start_move(self, key: str, activity: str, call) -> None:
        self._busy = key
        self._begin_job()
        self.query_one(StatusBar).set_activity(key, activity)
        self._refresh_sidebar()
        self._move_worker(key, call)

    @work(thread=True, group="engine", description="a conversation move")
    def _move_worker(self, key: str, call) -> None:
        sink = EventBatcher(lambda event: self.post_message(self.EngineEvent(key, event)))
        done = None
        try:
            done = call(sink)
        except Exception as exc:  # a refused move (ValueError) or a bug: one line, never a traceback
            sink(ev.ChatError("move", str(exc) or type(exc).__name__))
        finally:
            sink.flush()
            self._idle.set()
            self.post_message(self.TurnEnded(key, done))

    # -- fork ------------------------------------------------------------------------------------------

    def _start_fork(self, key: str, upto: int, prompt_text: str | None) -> None:
        if self._engine_job:
            self._toast("Wait for the reply to finish (Escape cancels it).", "Fork", "warning")
            return
        conv = self.controller.get(key)
        if not any(m.get("role") in ("user", "assistant") for m in conv.messages[:upto]):
            # At the first message nothing comes before it: the fork is a new chat with this
            # chat's system prompt and settings, the message in the box to send or change.
            fresh = self.controller.fresh_like(key)
            self._fork_ready(fresh.key, prompt_text, True)
            self._toast("New chat with this chat's system prompt and settings; its first message is in "
                        "the box: Enter sends it.", "Fork")
            return
        self._begin_job()
        self.query_one(StatusBar).set_activity(None, "forking…")
        self._fork_worker(key, upto, prompt_text)

    @work(thread=True, group="engine", description="fork a chat")
    def _fork_worker(self, key: str, upto: int, prompt_text: str | None) -> None:
        sink = EventBatcher(lambda event: self.post_message(self.EngineEvent(key, event)))
        fork_key = None
        try:
            fork_key = self.controller.fork(key, upto, sink).key
        except Exception as exc:
            sink(ev.ChatError("fork", str(exc) or type(exc).__name__))
        finally:
            sink.flush()
            self._idle.set()
            self._call_from_thread(self._fork_done, fork_key, prompt_text)

    def _fork_done(self, fork_key: str | None, prompt_text: str | None) -> None:
        self._end_job()
        self.query_one(StatusBar).set_activity(None, "")
        if fork_key is not None:
            self._fork_ready(fork_key, prompt_text, True)

    def _fork_ready(self, fork_key: str, prompt_text: str | None, switch: bool) -> None:
        """Give the fork a pane (shown at once when `switch`)."""
        async def add() -> None:
            conv = self._conversation(fork_key)
            if conv is None:
                return
            if self._pane_or_none(fork_key) is None:
                pane = await self._add_pane(fork_key)
                pane.log.show_messages(self._shown(conv.visible_messages()))
            if switch:
                self._switch(fork_key)
                if prompt_text:
                    self.query_one("#prompt", PromptInput).load_text(prompt_text)
            self._refresh_sidebar()

        self.run_worker(add(), group="panes", exclusive=False, exit_on_error=False)

    def _on_forked(self, event: ev.Forked, pane) -> None:
        if event.source == "none":
            how = "nothing cached: its first message prefills"
        else:
            how = f"{fmt.tokens(event.tokens)} tokens from {event.source}, no prefill, {fmt.ms(event.ms)}"
        conv = self._conversation(event.conversation)
        title = conv.display_title if conv is not None else event.conversation
        self._toast(f"{short_title(title)}: {how}", "Fork")

    # -- a full context ----------------------------------------------------------------------------

    def _on_context_wont_fit(self, event: ev.ContextWontFit, pane) -> None:
        from ds4tui.screens.widgets.choice_dialog import ChoiceDialog

        c = event.check
        key = self._active
        if c.fresh_tokens is not None and c.fresh_tokens + c.reserve > c.ctx:
            # Too long on its own: a fresh chat or dropping turns cannot help, so offer neither.
            lines = [f"This message is too long for the context: {fmt.tokens(c.fresh_tokens)} tokens with the "
                     f"system prompt, plus {fmt.tokens(c.reserve)} for the reply; the context holds "
                     f"{fmt.tokens(c.ctx)} (--ctx or `ctx` in the config). Nothing was sent; shorten it."]
            self.app.push_screen(ChoiceDialog("\n".join(lines), [("cancel", "OK")]))
            return
        lines = [f"The chat with this message takes {fmt.tokens(c.prompt_tokens)} tokens, plus "
                 f"{fmt.tokens(c.reserve)} for the reply; the context holds {fmt.tokens(c.ctx)}. "
                 "Nothing was sent or dropped."]
        choices = [("fresh", "Fresh chat (system prompt kept)")]
        if c.drop_turns:
            lines.append(f"Dropping the {c.drop_turns} oldest exchange(s) re-prefills "
                         f"{fmt.tokens(c.drop_prefill or 0)} tokens.")
            choices.append(("drop", f"Drop {c.drop_turns} oldest"))
        choices.append(("cancel", "Cancel"))

        def chosen(answer: str | None) -> None:
            self._context_choice(key, answer, c)

        self.app.push_screen(ChoiceDialog("\n".join(lines), choices), chosen)

    def _context_choice(self, key: str | None, answer: str | None, check: ev.FitCheck) -> None:
        if key is None or self.controller is None or answer in (None, "cancel"):
            return
        prompt = self.query_one("#prompt", PromptInput)
        text = prompt.text
        if answer == "drop" and check.drop_turns:
            self.controller.drop_oldest(key, check.drop_turns)
            pane = self._pane(key)
            for widget in pane.log.messages():
                widget.remove()
            pane.log.show_messages(self._shown(self.controller.get(key).visible_messages()))
            self._toast(f"Dropped {check.drop_turns} exchange(s); Enter sends the message.", "Context")
        elif answer == "fresh":
            fresh = self.controller.fresh_like(key)
            self._fork_ready(fresh.key, text, True)
            self._toast("Fresh chat with the same system prompt; Enter sends the message.", "Context")

    # -- find a chat --------------------------------------------------------------------------------

    def action_find_chat(self) -> None:
        """ctrl+f: search every stored chat's title and messages; Enter opens the one chosen."""
        if not self._model_ready_or_say():
            return
        from ds4tui.screens.find_chat import FindChatScreen

        def chosen(chat_id: str | None) -> None:
            if chat_id:
                self._start_resume(chat_id, how="stored")

        self.app.push_screen(FindChatScreen(self.controller), chosen)


class ChatMovesPalette:
    """Palette-only moves: fork the whole chat, export it."""

    def action_fork_chat(self) -> None:
        if not self._model_ready_or_say() or self._active is None:
            return
        conv = self.controller.get(self._active)
        if conv.messages:
            self._start_fork(self._active, len(conv.messages), None)

    def action_export_chat(self) -> None:
        """Write the active chat as NAME.md and NAME.json (OpenAI messages) in the export
        directory (config `export_dir`; paths.export_dir()), and say where, in full."""
        import time

        from ds4tui import paths
        from ds4tui.chat import transcript

        if not self._model_ready_or_say() or self._active is None:
            return
        conv = self.controller.get(self._active)
        folder = paths.export_dir(self.config.export_dir)
        # The chat is on screen: its last use is its last stored change, or now if none yet.
        used = int(conv.updated_at or time.time())
        try:
            md, js = transcript.write_export(folder, conv.messages, conv.title, conv.created_at, used,
                                             sha=conv.saved_sha)
        except OSError as exc:
            self._toast(f"Export failed: {folder}: {exc.strerror or exc}", "Export", "error")
            return
        self._toast(f"Wrote {md} and {js.name}", "Export")
