"""A `ds4tui serve` subprocess for the benches: a free loopback port, started, waited for, stopped.

Owns the process, `ask` (one streamed request timed from its send) and `process_memory`
(the server's resident set from /proc); the benches (serve_bench.py, shared_prefix_bench.py,
bench/serve_restart.py) decide what to send.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, cache_dir: str, disk: bool) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "ds4tui", "serve", "--model", args.model, "--port", str(port),
           "--cache-dir", cache_dir, "--live-sessions", str(args.live_sessions), "--log-level", "warning"]
    if not disk:
        cmd.append("--no-disk-cache")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ds4tui serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                return proc, root
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("ds4tui serve did not start within 300 s")


MEMORY_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")


def process_memory(pid: int) -> dict[str, int]:
    """Peak (VmHWM) and current (VmRSS, its anonymous and file-backed parts) resident set of
    process `pid` in bytes, from /proc/PID/status; zeros where /proc is missing (not Linux)."""
    out = dict.fromkeys(MEMORY_FIELDS, 0)
    try:
        with open(f"/proc/{pid}/status") as fp:
            for line in fp:
                key, _, rest = line.partition(":")
                if key in out:
                    out[key] = int(rest.split()[0]) * 1024  # the kernel writes kB
    except OSError:
        pass
    return out


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def ask(http, root: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat completion (greedy, usage included) timed from the send: {ttft_ms,
    total_ms, prompt_tokens, cached_tokens, completion_tokens, text}."""
    # No "model": llama-server ignores it, ds4tui serve answers with the one model it runs.
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first, usage, text = None, {}, []
    with http.stream("POST", f"{root}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    done = time.perf_counter()
    return {"ttft_ms": ((first or done) - sent) * 1000.0, "total_ms": (done - sent) * 1000.0,
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "text": "".join(text)}
