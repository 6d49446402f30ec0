"""The chat screen's side of the conversation store: deleting and archiving chats.

Owns: `ChatHistory`, mixed into `ChatScreen`: the palette's "Delete chat" and "Archive
chat", the sidebar's delete key, the questions asked before a delete (the cache browser's, with
a second one for pinned files), and what the
screen does after one (the chat's pane goes, another chat shows, the list is read
again). A delete removes the chat's history and its `.kv` files; nothing of it is
written again at quit. Leaves the work to the controller, in `EngineWorkers._delete_chat`.
"""

from __future__ import annotations

from rich.text import Text

from ds4tui.format.display import one_line
from ds4tui.screens.widgets.confirm_dialog import confirm_delete
from ds4tui.screens.widgets.status_bar import StatusBar
from ds4tui.screens.widgets.title_fit import short_title


class ChatHistory:
    """Delete (asked first) and archive, for the active chat or a sidebar row."""

    def action_delete_chat(self) -> None:
        if not self._model_ready_or_say() or self._active is None:
            return
        conv = self.controller.get(self._active)
        self._ask_delete(conv.display_title, key=conv.key)

    def action_archive_chat(self) -> None:
        if not self._model_ready_or_say() or self._active is None:
            return
        conv = self.controller.get(self._active)
        if conv.store_id is None:
            self._toast("Nothing to archive: the chat has no message yet.", "Archive", "warning")
            return
        if conv.busy:
            self._toast("Wait for the reply to finish (Escape cancels it).", "Archive", "warning")
            return
        try:
            self.controller.archive(conv.store_id)
        except Exception as exc:
            self._toast(f"Not archived: {exc}", "Archive", "error")
            return
        self._toast(f"Archived {short_title(conv.display_title)} (`ds4tui chats ls --archived`)", "Archive")

    def _ask_delete(self, title: str, *, key: str | None = None, chat_id: str | None = None) -> None:
        if self.controller is None or (key is None and chat_id is None):
            return
        if self._engine_job:
            self._toast("Wait for the reply to finish (Escape cancels it), then delete.", "Delete", "warning")
            return
        self._begin_job()
        self._count_pinned(key, chat_id, title)  # EngineWorkers: then _confirm_delete

    def _confirm_delete(self, key: str | None, chat_id: str | None, title: str, pinned: int,
                        error: str | None) -> None:
        """The questions of every delete of files (confirm_delete: a pinned file is asked about twice)."""
        self._end_job()
        if error is not None:
            self._toast(f"Not deleted: {error}", "Delete", "error")
            return
        question = Text("Delete the chat ")
        question.append(f"“{one_line(title, 60)}”", style="bold")
        question.append("? Its messages and its .kv files go for good.")

        def delete() -> None:
            if not self._engine_job:
                self._begin_job()
                self._delete_chat(key, chat_id, title)

        confirm_delete(self.app, question, delete, pinned=pinned)

    async def _chat_deleted(self, key: str | None, title: str, files: int | None, error: str | None) -> None:
        self._end_job()
        if error is not None:
            self._toast(f"Not deleted: {error}", "Delete", "error")
            return
        if key is not None:
            pane = self._pane_or_none(key)
            if pane is not None:
                await pane.remove()
            self.query_one(StatusBar).forget(key)
            self._send_queue.take(key)  # its bubble went with the pane
            if self._active == key:
                self._active = None
                rest = self.controller.list()
                if rest:
                    self._switch(rest[-1].key)
                else:
                    await self.action_new_chat()
        self._scan_saved()
        self._toast(f"Deleted {short_title(title)} ({files} .kv file(s) removed)", "Delete")
