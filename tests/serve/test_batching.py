"""Requests running together in EngineQueue (no HTTP): a stream whose client never reads is
cancelled once its unread text passes the bound, and the requests beside it finish unharmed,
each with the reply it gets alone."""

from __future__ import annotations

import asyncio

from ds4tui.chat.events import TokenText
from ds4tui.serve import protocol as p
from ds4tui.serve.worker import End, EngineQueue
from tests.serve.test_protocol import _reference_tokens
from tests.serve.test_serve import reference


def _long_reply_prompt(model) -> list[dict]:
    """Messages whose greedy reply runs 40 tokens without ending."""
    for q in range(50):
        messages = [{"role": "user", "content": f"slow reader {q}"}]
        if not any(b"<|" in piece for piece in _reference_tokens(model, messages, 40)):
            return messages
    raise AssertionError("no prompt with a long reply")


async def _end_of(job, read: bool) -> End:
    while True:
        item = await job.get() if read else None
        if isinstance(item, End):
            return item
        if not read:
            await asyncio.sleep(0.01)


async def test_a_client_that_never_reads_is_cancelled_and_holds_nobody(tiny_llama):
    from ds4tui.chat.stateless import StatelessChats
    from tests.serve.conftest import greedy_controller

    ctl = greedy_controller(tiny_llama, max_tokens=64)
    engine = EngineQueue(StatelessChats(ctl), max_waiting=4, parallel=3, max_unread=8)
    try:
        slow_messages = _long_reply_prompt(tiny_llama)
        slow = engine.submit(p.parse_chat_request({"messages": slow_messages, "stream": True, "max_tokens": 40,
                                                   "temperature": 0}))
        others = [[{"role": "user", "content": f"beside a slow reader {i}"}] for i in range(2)]
        jobs = [engine.submit(p.parse_chat_request({"messages": m, "max_tokens": 6, "temperature": 0}))
                for m in others]
        ends = await asyncio.wait_for(asyncio.gather(*(_end_of(j, read=True) for j in jobs)), 120)
        for m, end in zip(others, ends):
            assert end.error is None and end.result.text == reference(tiny_llama, m, max_tokens=6)
        for _ in range(12000):  # the slow one ends on its own (bounded wait)
            if engine.state()["running"] == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.state()["running"] == 0
        assert slow.dropped is not None and "unread" in slow.dropped
        queued = [await asyncio.wait_for(slow.events.get(), 30)]  # read at last: what was buffered
        while not isinstance(queued[-1], End):
            queued.append(await asyncio.wait_for(slow.events.get(), 30))
        texts = [e for e in queued if isinstance(e, TokenText)]
        assert isinstance(queued[-1], End) and 8 < len(texts) <= 10  # cut right after the bound
        state = engine.state()
        assert state["cancelled"] == 1 and state["served"] == 2
    finally:
        engine.close()
