"""Where `ds4tui serve`'s resident set goes: RSS after each start-up stage, and by mapping.

Usage (from the repo root, after `ds4tui models pull smollm2-135m-instruct`):

    .venv/bin/python bench/serve_memory.py [--model smollm2-135m-instruct] [--sessions 4] [--tokens 600]
    .venv/bin/python bench/serve_memory.py --pid PID      # a running server, by mapping only

Stages, in this one process, in the order `ds4tui serve` goes through them: Python alone,
`import torch`, the server's own modules (starlette, uvicorn, ds4tui.serve), the model's load,
the ChatController's warm_up (first forward, the KV spare, the move of the file's blocks into
huge pages, waited for here), then `--sessions` chats each prefilled with `--tokens` token
ids and answered with 16 tokens (what `bench serve` clients leave behind). Each line is
VmRSS with its anonymous and file-backed parts (/proc/self/status). Last, the mappings that
hold the memory (/proc/PID/smaps), grouped: the converted fp32 copy (model.safetensors), the
GGUF, torch's libraries, other libraries, anonymous memory (heap, KV buffers, huge pages).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MB = 1e6


def status(pid: int | str = "self") -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fp:
        for line in fp:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def line(stage: str, pid: int | str = "self") -> None:
    s = status(pid)
    print(f"{stage:<44} RSS {s['VmRSS'] / MB:7.0f} MB  anon {s['RssAnon'] / MB:6.0f}  file {s['RssFile'] / MB:6.0f}"
          f"  peak {s['VmHWM'] / MB:6.0f}", flush=True)


def _group(path: str) -> str:
    if path.endswith(".safetensors"):
        return "converted fp32 copy (model.safetensors)"
    if path.endswith(".gguf"):
        return "GGUF file"
    if "/torch/" in path:
        return "torch libraries"
    if path.startswith("/") and (".so" in path or "/python" in path):
        return "other libraries and the interpreter"
    if path.startswith("/"):
        return "other files: " + os.path.basename(path)
    return "anonymous (heap, KV buffers, huge pages)"


def by_mapping(pid: int | str = "self") -> None:
    rss: dict[str, int] = defaultdict(int)
    name = ""
    with open(f"/proc/{pid}/smaps") as fp:
        for row in fp:
            head = row.split()
            if "-" in head[0] and ":" not in head[0]:  # a mapping's first line: range perms offset dev inode [path]
                name = _group(head[5] if len(head) > 5 else "")
            elif head[0] == "Rss:":
                rss[name] += int(head[1]) * 1024
    for name, b in sorted(rss.items(), key=lambda kv: -kv[1]):
        if b >= MB:
            print(f"  {name:<52} {b / MB:7.0f} MB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--pid", type=int, help="only group a running process's mappings")
    args = ap.parse_args()
    if args.pid:
        line(f"process {args.pid}", args.pid)
        by_mapping(args.pid)
        return 0
    line("python")
    import torch  # noqa: F401

    line("+ import torch")
    import uvicorn  # noqa: F401

    import ds4tui.serve.app  # noqa: F401
    import ds4tui.serve.main  # noqa: F401

    line("+ uvicorn, starlette, ds4tui.serve")
    from ds4tui.chat.controller import ChatController
    from ds4tui.chat.stateless import StatelessChats
    from ds4tui.chat.turn import TurnOptions
    from ds4tui.config import Config
    from ds4tui.engine.loader import load_model
    from ds4tui.engine.sampling import SamplingParams

    model = load_model(args.model)
    line("+ load_model")
    with tempfile.TemporaryDirectory(prefix="ds4tui-serve-memory-") as tmp:
        ctl = ChatController(model, Config(model=args.model, cache_dir=tmp))
        ctl.warm_up()
        line(f"+ warm_up (ctx {ctl.config.ctx or model._ctx(None)}, kv {ctl.config.kv_dtype})")
        if getattr(model, "huge_pages", None) is not None:
            model.huge_pages.wait()
            line("+ blocks moved into huge pages")
        chats = StatelessChats(ctl)
        options = TurnOptions(sampling=SamplingParams(temperature=0.0), max_tokens=16)
        words = " ".join(f"word{i}" for i in range(args.tokens // 3))
        for i in range(args.sessions):
            chats.complete([{"role": "user", "content": f"chat {i}: {words}"}], lambda e: None, options)
            time.sleep(0.5)  # let prepare_session's background touch finish before reading
            line(f"+ chat {i + 1} ({args.tokens}-ish tokens, 16 out)")
        print("by mapping:")
        by_mapping()
        ctl.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
