"""The chat backend contract (chat/backend.py): the screens call nothing outside it, and both
controllers implement all of it. One scenario calls every member on the embedded engine
(tiny-llama, greedy, disk cache on) and on the remote one (`ds4tui serve` running tiny-llama),
checks each result on both, and compares the two chats: greedy replies must be the same
text, so the per-chat settings (F3) really went with the remote requests."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from ds4tui.chat import events as ev
from ds4tui.chat.backend import ChatBackend
from ds4tui.chat.controller import ChatController
from ds4tui.chat.remote import RemoteChatController
from ds4tui.chat.settings import CHAT_KEYS
from ds4tui.config import Config

SCREENS = Path(__file__).resolve().parents[2] / "ds4tui" / "screens"
MEMBERS = {name for name in vars(ChatBackend) if not name.startswith("_")}


class Recorder(list):
    def __call__(self, event) -> None:
        self.append(event)

    def of(self, kind):
        return [e for e in self if isinstance(e, kind)]


class Used:
    """The controller, noting every member the test touches (the controller's own calls to
    itself go past it)."""

    def __init__(self, target) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "used", set())

    def __getattr__(self, name):
        self.used.add(name)
        return getattr(self._target, name)


def test_the_screens_call_only_the_contract():
    called = set()
    for path in SCREENS.rglob("*.py"):
        called |= set(re.findall(r"\bcontroller\.([A-Za-z_]\w*)", path.read_text()))
    assert called, "the pattern no longer finds the screens' calls"
    assert called - MEMBERS == set()


@pytest.mark.parametrize("cls", [ChatController, RemoteChatController])
def test_both_controllers_have_every_member_with_its_parameters(cls):
    for name in sorted(MEMBERS):
        want = inspect.getattr_static(ChatBackend, name)
        if isinstance(want, property):
            if name == "disk_cache_notice":  # an attribute set in __init__ on both
                assert "disk_cache_notice" in inspect.getsource(cls.__init__), name
            else:
                assert isinstance(inspect.getattr_static(cls, name), property), name
            continue
        have = getattr(cls, name, None)
        assert callable(have), f"{cls.__name__} has no {name}"
        assert list(inspect.signature(have).parameters) == list(inspect.signature(want).parameters), name


def _embedded(model, tmp: Path) -> ChatController:
    return ChatController(model, Config(model="tiny-llama", temperature=0.0, max_tokens=8,
                                        cache_dir=str(tmp / "kv"), data_dir=str(tmp / "data")))


def _remote(url: str, tmp: Path) -> RemoteChatController:
    return RemoteChatController(url, Config(temperature=0.0, max_tokens=8, data_dir=str(tmp / "data")))


def exercise(ctl, embedded: bool) -> tuple[set[str], dict]:
    """Every member of the contract, each checked; returns what was used and the chats' texts."""
    c = Used(ctl)
    store = ctl.history.store
    seen: dict = {}
    rec = Recorder()

    assert isinstance(ctl, ChatBackend)
    assert isinstance(c.config, Config)
    assert (c.model_info is not None) == embedded and (c.cache_store is not None) == embedded
    assert c.disk_cache_notice is None and c.history_notice is None
    c.warm_up()
    assert c.has_sliding_window() is False and c.live_count() >= 0

    conv = c.new_conversation()
    key = conv.key
    assert c.find(key) is conv and c.get(key) is conv and conv in c.list()
    first = c.send(key, "contract: the first question", rec)
    assert first is not None and [m["role"] for m in conv.messages] == ["user", "assistant"]
    first_text = conv.messages[-1]["content"]
    assert first.tokens > 3 and "".join(e.text for e in rec.of(ev.TokenText)) == first_text
    # The remote one names the server's model once it has asked for it.
    assert c.model_name.startswith("tiny-llama") and ("chatml" if embedded else "tiny-llama") in c.model_description()
    assert c.ctx_size() == 2048  # tiny-llama's; the remote one from the server's /v1/models
    assert c.check_fit(key, "a short one").fits
    c.rename(key, "Contract chat")
    assert store.get(conv.store_id).title == "Contract chat"

    # F3: this chat's sampling and system prompt; the next request carries them.
    assert set(c.chat_settings(key)) == set(CHAT_KEYS) | {"system_prompt"}
    c.set_chat_settings(key, max_tokens=3, system_prompt="Answer briefly.")
    assert c.chat_settings(key)["max_tokens"] == 3 and c.chat_settings(key)["system_prompt"] == "Answer briefly."
    with pytest.raises(ValueError):
        c.set_chat_settings(key, no_such_setting=1)
    stored = store.get(conv.store_id)
    assert stored.system_prompt == "Answer briefly." and stored.settings["max_tokens"] == 3

    # ctrl+r and the versions (←/→).
    regen = c.regenerate(key, Recorder())
    last = len(conv.messages) - 1
    assert regen is not None and regen.regenerated and regen.tokens <= 3  # the chat's own max_tokens
    assert c.alternatives(key, last) == (1, 2)
    assert c.show_alternative(key, last, -1) == first_text and c.alternatives(key, last) == (0, 2)
    shown = c.show_alternative(key, last, 1)
    assert c.alternatives(key, last) == (1, 2) and store.load(conv.store_id).alternatives[last][1] == shown
    # The menu's "Delete this version": a third one, deleted; the store forgets it too.
    assert c.regenerate(key, Recorder()) is not None and c.alternatives(key, last) == (2, 3)
    assert c.delete_version(key, last) == shown and c.alternatives(key, last) == (1, 2)
    assert list(store.load(conv.store_id).alternatives[last]) == conv.alternatives[last]
    seen["regenerated"] = [dict(m) for m in conv.messages]
    assert c.send(key, "contract: the second question", Recorder()) is not None

    # e: edit and resend; the old continuation is kept as a fork.
    before = [dict(m) for m in conv.messages]
    done, kept = c.edit(key, 1, "contract: the first question, edited", Recorder())
    assert done is not None and kept is not None and kept.display_title == "Contract chat (fork)"
    assert kept.messages == before and store.get(kept.store_id).forked_from == conv.store_id
    assert [m["content"] for m in conv.messages[:2]] == ["Answer briefly.", "contract: the first question, edited"]
    assert len(conv.messages) == 3
    seen["edited"] = [dict(m) for m in conv.messages]

    # f: a fork at a reply.
    forks = Recorder()
    branch = c.fork(key, 3, forks)
    [forked] = forks.of(ev.Forked)
    assert forked.conversation == branch.key and forked.at_message == 3
    assert branch.messages == conv.messages and store.get(branch.store_id).forked_from == conv.store_id
    assert c.send(branch.key, "contract: on the branch", Recorder()) is not None
    c.drop_oldest(branch.key, 1)
    assert [m["content"] for m in branch.messages[:2]] == ["Answer briefly.", "contract: on the branch"]
    assert store.load(branch.store_id).messages == tuple(branch.messages)

    # ctrl+f: find (every branch: the edit's old text is in the fork and in conv's tree), then
    # open what was found (the chat open already: the same one).
    hits = {h.chat_id: h for h in c.search("contract: the second question")}
    assert {conv.store_id, kept.store_id} <= set(hits) and hits[conv.store_id].how == "open now"
    assert c.open_stored(hits[conv.store_id].chat_id) is conv
    if embedded:  # F4's resume of a chat's titled file opens that chat
        assert c.open_file(conv.saved_sha) is conv
    else:
        with pytest.raises(LookupError, match="needs the embedded engine"):
            c.open_file("0" * 40)
    assert c.import_existing().imported == 0  # nothing older here

    fresh = c.fresh_like(key)
    assert fresh.messages == [{"role": "system", "content": "Answer briefly."}] and fresh.overrides == conv.overrides

    # A message queued when the app quit: stored unanswered, it comes back as the chat's draft.
    unsent = c.new_conversation()
    c.keep_draft(unsent.key, "contract: never sent")
    assert unsent.messages == [] and unsent.store_id is not None
    assert c.open_stored(unsent.store_id) is unsent  # open already: the same chat
    c.close(unsent.key)
    assert c.open_stored(unsent.store_id).draft == "contract: never sent"

    # Stored chats: import, close, list, open, archive, resume, delete.
    imported = c.import_messages([{"role": "user", "content": "imported question"},
                                  {"role": "assistant", "content": "imported answer"}], title="Imported chat")
    c.close(imported.key)
    [row] = [s for s in c.stored_chats() if s.id == imported.store_id]
    assert c.kv_on_disk(row) is False  # never had a .kv file
    opened = Recorder()
    reopened = c.open_stored(row.id, opened)
    assert reopened.messages == imported.messages and opened.of(ev.HistoryOpened)
    c.close(reopened.key)
    c.archive(row.id)
    assert row.id not in {s.id for s in c.stored_chats()} and row.id in {s.id for s in c.stored_chats(archived=True)}
    c.archive(row.id, False)
    resumed = c.resume("Imported chat")
    assert resumed.messages == imported.messages and resumed.store_id == row.id
    c.close(resumed.key)
    assert c.delete_stored(row.id) == 0 and store.get(row.id) is None

    # Escape: cancel at the first token of a long reply; what came is kept, in the store too.
    c.set_chat_settings(key, max_tokens=200)

    def cancel_at_first_token(event):
        if isinstance(event, ev.TokenText):
            c.cancel()

    cut = c.send(key, "contract: cut me off", cancel_at_first_token)
    assert cut is not None and cut.stop == "cancelled" and 0 < cut.tokens < 200
    assert store.load(conv.store_id).messages == tuple(conv.messages)
    c.update_config(temperature=0.0)
    assert c.config.temperature == 0.0
    # A stored reply as the screen shows it: a think block folded apart from the answer.
    view = c.reply_view("<think>plan</think>The answer.")
    assert (view.reasoning, view.content, view.calls) == ("plan", "The answer.", ())

    kv_files = len(list(Path(ctl.config.cache_path()).glob("*.kv"))) if embedded else 0
    kept_file = kept.saved_sha
    if embedded:  # a pinned file among what a delete removes: the screen asks twice
        assert c.pinned_files(kept.key) == 0
        assert ctl.checkpoints.store.set_pinned(kept_file, True)
        assert c.pinned_files(kept.key) == 1 and c.pinned_files(chat_id=kept.store_id) == 1
    else:
        assert c.pinned_files(kept.key) == 0 and c.pinned_files(chat_id=kept.store_id) == 0
    removed = c.delete(kept.key)
    assert store.get(kept.store_id) is None and c.find(kept.key) is None
    if embedded:  # the fork's titled file (the old continuation) and the checkpoints of its text
        assert kept_file and removed >= 1 and not ctl.checkpoints.store.path_for(kept_file).exists()
        assert len(list(Path(ctl.config.cache_path()).glob("*.kv"))) == kv_files - removed
    else:
        assert removed == 0  # a remote chat has no .kv file here
    c.shutdown()
    return c.used, seen


def test_every_member_on_both_backends(server, tiny_llama, tmp_path):
    used, local = exercise(_embedded(tiny_llama, tmp_path / "embedded"), embedded=True)
    assert used == MEMBERS
    used, remote = exercise(_remote(server.url, tmp_path / "remote"), embedded=False)
    assert used == MEMBERS
    assert remote == local  # the same greedy replies: system prompt and max_tokens went to the server
