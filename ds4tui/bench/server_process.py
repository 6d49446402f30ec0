"""A `ds4tui serve` subprocess for the benches: a free loopback port, started, waited for, stopped.

Owns only the process: the benches (serve_bench.py, shared_prefix_bench.py,
bench/serve_restart.py) send the requests.
"""

from __future__ import annotations

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


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
