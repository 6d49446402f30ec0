"""Regenerate the README's screenshot: the real chat, one greedy SmolLM2 reply, saved by the
app itself (Textual's save_screenshot) as docs/img/chat.svg.

    .venv/bin/python scripts/screenshot.py [--model smollm2-135m-instruct] [--out docs/img/chat.svg]

Runs headless (no terminal needed) with a throwaway cache and config, so nothing of yours shows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is the capital of France? One sentence."
SIZE = (100, 30)


async def shoot(model_name: str, out: Path) -> None:
    from ds4tui.config import Config
    from ds4tui.engine.loader import load_model
    from ds4tui.screens.app import Ds4TuiApp
    from ds4tui.screens.chat import ChatScreen

    model = load_model(model_name)
    app = Ds4TuiApp(Config(model=model_name, temperature=0.0, max_tokens=40), model=model, cursor_blink=False)
    ended = asyncio.Event()

    def on_message(message) -> None:
        if isinstance(message, ChatScreen.TurnEnded):
            ended.set()

    async with app.run_test(size=SIZE, message_hook=on_message) as pilot:
        await pilot.pause()
        prompt = app.screen.query_one("#prompt")
        prompt.insert(PROMPT)
        await pilot.press("enter")
        await asyncio.wait_for(ended.wait(), 600)
        app.clear_notifications()
        await pilot.pause(0.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=out.name, path=str(out.parent))
    print(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "chat.svg")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DS4TUI_CACHE_DIR"] = str(Path(tmp) / "kv")
        os.environ["DS4TUI_CONFIG"] = str(Path(tmp) / "config.toml")
        os.environ["DS4TUI_TRANSCRIPTS_DIR"] = str(Path(tmp) / "transcripts")
        os.environ["DS4TUI_STORE"] = str(Path(tmp) / "conversations.sqlite3")
        asyncio.run(shoot(args.model, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
