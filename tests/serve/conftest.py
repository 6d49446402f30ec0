"""`ds4tui serve` on tiny-llama in a subprocess, on a free loopback port.

Every wait is bounded: the server must answer /health within STARTUP_S, and it
is stopped with SIGINT (its shutdown saves run) then killed if it lingers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

STARTUP_S = 300.0
STOP_S = 60.0
API_KEY = "test-key-0123456789"


@dataclass
class Server:
    url: str  # the /v1 base URL
    root: str  # scheme://host:port
    cache_dir: Path
    proc: subprocess.Popen
    log: Path

    def health(self) -> dict:
        return httpx.get(f"{self.root}/health", timeout=60).json()

    def wait_health(self, predicate, timeout: float = 120.0) -> dict:
        """Poll /health until predicate(state) holds; the last state (the test asserts on it)."""
        deadline = time.monotonic() + timeout
        state = self.health()
        while not predicate(state) and time.monotonic() < deadline:
            time.sleep(0.05)
            state = self.health()
        return state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ds4tui", "serve", *args]


def isolated_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, DS4TUI_CONFIG=str(tmp / "config.toml"), DS4TUI_CACHE_DIR=str(tmp / "kv"))
    env.update(extra)
    return env


@contextmanager
def running_server(tmp: Path, *args: str, env: dict[str, str] | None = None):
    port = free_port()
    cache = tmp / "kv"
    log = tmp / "server.log"
    cmd = serve_command("--model", "tiny-llama", "--port", str(port), "--cache-dir", str(cache),
                        "--log-level", "warning", *args)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or isolated_env(tmp))
    root = f"http://127.0.0.1:{port}"
    server = Server(url=f"{root}/v1", root=root, cache_dir=cache, proc=proc, log=log)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ds4tui serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"ds4tui serve did not answer within {STARTUP_S} s:\n{log.read_text()}")
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_S)


@pytest.fixture(scope="package")
def server(tmp_path_factory):
    """The shared server: default queue, its own cache directory, a live session per load-test
    client (test_load compares with the embedded engine's live sessions; parking to disk is
    tested in tests/chat/test_stateless.py)."""
    with running_server(tmp_path_factory.mktemp("serve"), "--live-sessions", "8") as s:
        yield s


@pytest.fixture(scope="package")
def tiny_llama():
    from ds4tui.engine.loader import load_model

    return load_model("tiny-llama")


def greedy_controller(model, **config):
    """The embedded engine, greedy, no disk cache: the reference the server's replies must equal."""
    from ds4tui.chat.controller import ChatController
    from ds4tui.config import Config

    values = dict(model=model.info.name, temperature=0.0, no_disk_cache=True, live_sessions=16)
    values.update(config)
    return ChatController(model, Config(**values))


def reference_replies(model, conversations: list[list[dict]], max_tokens: int) -> list[str]:
    """The embedded engine's greedy reply to each message list, one after another, alone: the
    same StatelessChats the server runs (a later list reuses an earlier one's live session, as
    on the server), without the server (and its scheduler) around it."""
    from ds4tui.chat.stateless import StatelessChats
    from ds4tui.chat.turn import TurnOptions
    from ds4tui.engine.sampling import SamplingParams

    chats = StatelessChats(greedy_controller(model, max_tokens=max_tokens))
    options = TurnOptions(sampling=SamplingParams(temperature=0.0), max_tokens=max_tokens, drop_partial=True)
    out = []
    for messages in conversations:
        done = chats.complete(messages, lambda e: None, options)
        assert done is not None
        out.append(done.text)
    return out
