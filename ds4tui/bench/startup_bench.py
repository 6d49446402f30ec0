"""`ds4tui bench startup [--model SPEC] [--runs N] [--json]`: how soon the chat can be used.

Owns the start-up measurement as a user meets it: the real `ds4tui` command
in a pseudo-terminal (120 x 40), its screen output read as it comes. Per run:

- first paint: the prompt's placeholder is on the screen;
- typing-ready: keys typed right after the first paint are echoed in the
  prompt (the UI thread handles input while the model loads behind it);
- model-ready: the status bar shows the context meter, which the chat sets
  when the model is loaded and warmed up (`ChatController.warm_up`);
then ctrl+q quits. Beside it, in alternation, `python -c "import torch"`,
the floor of any start that needs torch. Goals (warm start, i.e. files in
the page cache: the first run is a discarded warm-up): typing-ready <= 1.0 s,
model-ready <= import torch + 0.5 s.

Each run uses an empty temporary cache directory and no config file, so it
measures the start, not a scan of someone's saved chats. Both children run
with Python's bytecode cache on (PYTHONDONTWRITEBYTECODE removed from their
environment), as an installed app's second start has it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_TYPING_READY_S = 1.0
GOAL_MODEL_OVER_TORCH_S = 0.5
PLACEHOLDER = b"Enter sends"  # in the prompt's placeholder, one styled run on the screen
TYPED = "qzxv"  # typed after the first paint; its echo on the screen means the UI took it
METER = re.compile("ctx [▰▱]+".encode("utf-8"))  # the status bar's context meter: model ready
TIMEOUT_S = 120.0


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser(
        "startup", help="time to the chat's first paint, typing-ready and model-ready (in a pty)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="model spec (default smollm2-135m-instruct)")
    p.add_argument("--runs", type=int, default=5, help="measured runs after one warm-up run (medians)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_bench_startup)


def run_bench_startup(args: argparse.Namespace) -> int:
    from ds4tui.cli.errors import CliError

    if args.runs < 1:
        raise CliError("--runs must be at least 1")
    try:
        result = bench_startup(args.model, args.runs)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        raise CliError(str(exc)) from None
    print(json.dumps(result, indent=2) if args.json else _table(result))
    return 0


def bench_startup(model: str, runs: int) -> dict:
    chat, torch_s = [], []
    for i in range(runs + 1):  # the first round warms the page cache and is dropped
        t = time_import_torch()
        c = time_chat_start(model)
        if i:
            torch_s.append(t)
            chat.append(c)
    med = {k: statistics.median(r[k] for r in chat) for k in ("first_paint_s", "typing_ready_s", "model_ready_s")}
    import_torch = statistics.median(torch_s)
    return {
        "model": model,
        "runs": runs,
        **med,
        "import_torch_s": import_torch,
        "model_ready_over_torch_s": med["model_ready_s"] - import_torch,
        "runs_detail": chat,
        "import_torch_runs_s": torch_s,
        "load_average": os.getloadavg()[0],
        "goal_typing_ready_s": GOAL_TYPING_READY_S,
        "goal_model_over_torch_s": GOAL_MODEL_OVER_TORCH_S,
    }


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


def time_import_torch() -> float:
    """Wall seconds of a fresh `python -c "import torch"` (interpreter start included)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=_child_env())
    return time.perf_counter() - t0


def time_chat_start(model: str, cols: int = 120, rows: int = 40) -> dict:
    """Start `ds4tui --model MODEL` in a pty; seconds from the spawn to first paint, typing-ready
    and model-ready."""
    import fcntl
    import pty
    import struct
    import termios

    with tempfile.TemporaryDirectory(prefix="ds4tui-bench-startup-") as tmp:
        env = _child_env(TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows),
                   DS4TUI_CONFIG=os.path.join(tmp, "none.toml"), DS4TUI_CACHE_DIR=os.path.join(tmp, "kv"),
                   DS4TUI_TRANSCRIPTS_DIR=os.path.join(tmp, "transcripts"))
        pid, fd = pty.fork()
        if pid == 0:  # the child: the app, on the pty
            try:
                os.execve(sys.executable, [sys.executable, "-m", "ds4tui", "--model", model], env)
            finally:
                os._exit(127)
        t0 = time.perf_counter()
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        seen = bytearray()
        marks: dict[str, float] = {}
        typed_from = None
        try:
            while "model_ready_s" not in marks or "typing_ready_s" not in marks:
                if time.perf_counter() - t0 > TIMEOUT_S:
                    raise RuntimeError(f"the chat did not get ready in {TIMEOUT_S:.0f} s: {sorted(marks)}")
                chunk = _read(fd, 0.05)
                if chunk is None:
                    raise RuntimeError(f"the chat exited before it was ready: {seen[-400:]!r}")
                seen += chunk
                now = time.perf_counter() - t0
                if "first_paint_s" not in marks and PLACEHOLDER in seen:
                    marks["first_paint_s"] = now
                    typed_from = len(seen)
                    os.write(fd, TYPED.encode())
                if typed_from is not None and "typing_ready_s" not in marks and TYPED.encode() in seen[typed_from:]:
                    marks["typing_ready_s"] = now
                if "model_ready_s" not in marks and METER.search(seen):
                    marks["model_ready_s"] = now
        finally:
            _quit(pid, fd)
    return marks


def _read(fd: int, timeout: float) -> bytes | None:
    """What the pty has within `timeout` (b"" if nothing); None when the child side closed."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return b""
    try:
        data = os.read(fd, 1 << 16)
    except OSError:  # EIO: the child exited
        return None
    return data or None


def _quit(pid: int, fd: int) -> None:
    """ctrl+q, keep draining the screen output until the app exits; SIGKILL after 30 s."""
    try:
        os.write(fd, b"\x11")
    except OSError:
        pass
    end = time.monotonic() + 30.0
    while time.monotonic() < end:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if _read(fd, 0.1) is None:
            os.waitpid(pid, 0)
            break
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    os.close(fd)


def _table(r: dict) -> str:
    def ok(flag: bool) -> str:
        return "ok" if flag else "MISSED"

    rows = [
        ("model", r["model"]),
        ("runs", f"{r['runs']} after a warm-up run (medians; load average {r['load_average']:.1f})"),
        ("first paint", f"{r['first_paint_s']:.2f} s"),
        ("typing-ready", f"{r['typing_ready_s']:.2f} s  (goal <= {GOAL_TYPING_READY_S:.1f} s: "
                         f"{ok(r['typing_ready_s'] <= GOAL_TYPING_READY_S)})"),
        ("model-ready", f"{r['model_ready_s']:.2f} s"),
        ("python -c 'import torch'", f"{r['import_torch_s']:.2f} s"),
        ("model-ready - import torch", f"{r['model_ready_over_torch_s']:.2f} s  (goal <= {GOAL_MODEL_OVER_TORCH_S:.1f} s: "
                                       f"{ok(r['model_ready_over_torch_s'] <= GOAL_MODEL_OVER_TORCH_S)})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
