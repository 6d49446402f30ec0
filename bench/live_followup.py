"""Time to first token of follow-up messages on a live session (no disk cache), headless.

Usage (from the repo root):

    .venv/bin/python bench/live_followup.py [--model smollm2-135m-instruct] [--context-words 3800] [--messages 12]

Sends one long first message (a repeated paragraph, about 4K tokens with SmolLM2 at the
default 3800 words), then short follow-ups through `ChatController.send`, greedy, 4 reply
tokens each, and prints each follow-up's `Done.ttft_ms` (from the send, the context-fit check
included, to the first token) and their median. What it shows is the per-message work that
grows with the chat (the live session's prompt check) beside the forward of the new tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI sets it

PARAGRAPH = ("A terminal chat application keeps the state of a conversation in memory and on disk. "
             "When a user opens an old conversation, the program loads the saved rows instead of reading "
             "the whole prompt again. ")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--context-words", type=int, default=3800)
    p.add_argument("--messages", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import torch

    from ds4tui.chat.controller import ChatController
    from ds4tui.config import Config
    from ds4tui.engine.loader import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    words = PARAGRAPH.split()
    first = "Read this text:\n\n" + " ".join(words[i % len(words)] for i in range(args.context_words))
    config = Config(model=args.model, temperature=0.0, max_tokens=4, no_disk_cache=True, ctx=min(8192, model.info.n_ctx))
    controller = ChatController(model, config)
    key = controller.new_conversation().key
    done = controller.send(key, first)
    ttft = [controller.send(key, f"Question {i}: what is the text about?").ttft_ms for i in range(args.messages)]
    print(f"{args.model}: {done.context_tokens} tokens of context, {args.messages} follow-ups,"
          f" first token median {statistics.median(ttft):.2f} ms ({' '.join(f'{t:.1f}' for t in ttft)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
