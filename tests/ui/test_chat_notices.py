"""Which cache events become toasts, and how loudly (the chat's notification policy)."""

from __future__ import annotations

from ds4tui.cache.events import Evicted, EvictedFile, Hit, Miss, Rejected, Saved, SaveFailed
from ds4tui.chat.events import ChatError
from ds4tui.screens.chat_notices import notice_for


def _saved(reason: str, reused: bool = False) -> Saved:
    return Saved(sha="ab" * 20, path="/x.kv", reason=reason, tokens=2048, bytes=3 << 20, ms=12.0,
                 created_at=0, reused=reused)


def test_hits_and_checkpoints_are_announced_but_per_turn_session_saves_are_not():
    hit = notice_for(Hit(sha="ab" * 20, path="/x.kv", reason="cold", tokens=4096, text_bytes=9, bytes=1 << 20,
                         hits=2, ms=80.0))
    assert hit.toast and "4,096 tokens" in hit.toast and hit.severity == "information"
    assert notice_for(_saved("cold")).toast.startswith("Checkpoint (cold): 2,048 tokens, 3.0 MiB")
    assert "already on disk" in notice_for(_saved("shutdown", reused=True)).toast
    session = notice_for(_saved("agent-session"))
    assert session.toast is None and session.status == "session saved (2,048 tok)"
    assert notice_for(Miss("no cached prefix")).toast is None


def test_failures_are_loud_and_name_the_reason():
    failed = notice_for(SaveFailed("disk full (ENOSPC): No space left on device", 10, 100))
    assert failed.severity == "error" and "disk full" in failed.toast
    rejected = notice_for(Rejected("cd" * 20, "stored text hash does not match the file name", True))
    assert rejected.severity == "warning" and "cdcdcdcdcdcd" in rejected.toast and "hash" in rejected.toast
    evicted = notice_for(Evicted((EvictedFile("ef" * 20, "cold", 10, 0, 1 << 20, 0.1),), 1 << 20, 4 << 30))
    assert evicted.severity == "warning" and "Evicted 1 file(s), 1.0 MiB" in evicted.toast
    assert notice_for(Evicted((), 0, 1)).toast is None
    assert notice_for(ChatError("save", "boom")).severity == "error"


def test_every_chat_event_type_has_exactly_one_screen_handler():
    """The chat screen dispatches by event type: a new event in ChatEvent needs its entry."""
    from typing import get_args

    from ds4tui.chat.events import ChatEvent
    from ds4tui.screens.chat import ChatScreen

    assert set(ChatScreen._EVENT_HANDLERS) == set(get_args(ChatEvent))


def test_the_stats_line_reads_in_order_and_keeps_a_rejection_short():
    from ds4tui.chat.events import CacheReport, Done
    from ds4tui.screens.chat_notices import stats_line
    from ds4tui.screens.widgets import fmt

    reason = "file rejected: checksum mismatch: xxh3 94aa568a4b60f1e8, file says 2fdfe3eb1e3da54f"
    done = Done(tokens=100, tok_s=82.2, prompt_tokens=1716, prefill_tok_s=300.0, ttft_ms=6290.0,
                context_tokens=1816, stop="eos",
                cache=CacheReport("cold", 0, 1716, reason=reason))
    assert stats_line(done) == ("cold: file rejected: checksum mismatch · prefilled 1,716 · "
                                "reply 100 tokens at 82.2 tok/s · first token 6.3 s")
    assert fmt.ms(999.4) == "999 ms" and fmt.ms(1500) == "1.5 s" and fmt.ms(3.25) == "3.2 ms"
