"""The UI thread's CPU per update of a streaming reply (append + one frame), in App.run_test at
80x24, below a 15,110-character message: an 11-item list, a 40-line Python fence and a 15-row
table, appended 12 characters at a time. Prints the median per kind.

    PYTHONPATH=$PWD .venv/bin/python bench/stream_tail.py

Run it on two checkouts back to back (the machine's load moves both): docs/perf-archive.md,
"Streaming in the app".
"""

from __future__ import annotations

import asyncio
import statistics
import time

from textual.app import App

from ds4tui.screens.widgets.chat_log import AssistantMessage, ChatLog

LIST = "Five facts:\n\n" + "".join(f"{i}. Paris fact number {i} is about **the city** and its `history`.\n"
                                   for i in range(1, 12))
FENCE = "Here:\n\n```python\n" + "".join(f"def f{i}(x):\n    return x * {i} + sum(range({i}))\n"
                                        for i in range(20)) + "```\n"
TABLE = "Cities:\n\n| city | people | river |\n|---|---|---|\n" + "".join(f"| City {i} | {i}.1M | River {i} |\n"
                                                                   for i in range(15))


class Host(App):
    def compose(self):
        yield ChatLog()


async def per_update(text: str) -> tuple[float, int]:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        log = app.query_one(ChatLog)
        log.add_user("word " * 3022)
        reply = AssistantMessage()
        await log.mount(reply)
        await pilot.pause()
        costs = []
        for k in range(0, len(text), 12):
            t = time.thread_time()
            reply.append(text[k:k + 12])
            await pilot.pause()
            costs.append((time.thread_time() - t) * 1000)
        return statistics.median(costs), len(costs)


if __name__ == "__main__":
    for name, text in (("list", LIST), ("fence", FENCE), ("table", TABLE)):
        median, n = asyncio.run(per_update(text))
        print(f"{name}: {n} updates, median {median:.1f} ms UI CPU per update")
