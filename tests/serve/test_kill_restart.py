"""kill -9 of `ds4tui serve` in the middle of requests, 20 times over one cache directory: every
file left is sound, and the next start reuses all but at most one checkpoint interval of the
conversation it had answered (docs/serve.md, "After a crash")."""

from __future__ import annotations

import json
import random
import signal
import threading
import time

import httpx
import pytest

from ds4tui.cache.store import KvStore
from ds4tui.cache.policy import CachePolicy
from tests.serve.conftest import isolated_env, running_server

pytestmark = pytest.mark.slow  # 20 server starts, each loading torch and a tiny model

INTERVAL = 128  # continued_interval_tokens: a multiple of the 64-token alignment below
MIN_TOKENS = CachePolicy().min_tokens  # no continued checkpoint below it (ds4's)
# ~45 tiny-llama tokens: a conversation passes MIN_TOKENS in a dozen turns, and starts over
# before it fills the 2048-token context.
MESSAGE = "Turn {n}: the tide came in at dawn and the keeper wrote it in the harbour log."
RESTART_AT = 1500


def _post(root: str, messages: list[dict], timeout: float = 120) -> dict:
    body = {"model": "tiny-llama", "messages": messages, "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{root}/v1/chat/completions", json=body, timeout=timeout)
    r.raise_for_status()
    return r.json()["usage"]


def test_kill_9_loses_at_most_one_checkpoint_interval(tmp_path):
    (tmp_path / "config.toml").write_text(f"continued_interval_tokens = {INTERVAL}\ncheckpoint_align_tokens = 64\n")
    env = isolated_env(tmp_path)
    rng = random.Random(31)
    messages: list[dict] = []
    last_prompt = 0  # prompt tokens of the last request answered before a kill
    n = 0
    checked = 0
    for round_ in range(20):
        with running_server(tmp_path, "--live-sessions", "2", env=env) as server:
            if messages and last_prompt:
                # The first request after the start: the history the server had answered, and
                # the next message. Its prefix on disk: the last frontier at or below that
                # prompt (a continued file), or the first prompt's cold file below MIN_TOKENS.
                n += 1
                ask = messages + [{"role": "user", "content": MESSAGE.format(n=n)}]
                usage = _post(server.root, ask)
                frontier = last_prompt // INTERVAL * INTERVAL
                if frontier >= MIN_TOKENS:
                    assert usage["prompt_tokens_details"]["cached_tokens"] >= frontier, (round_, usage, last_prompt)
                    assert usage["prompt_tokens_details"]["cached_tokens"] >= last_prompt - INTERVAL
                    checked += 1
                messages, last_prompt = ask + [{"role": "assistant", "content": "Noted."}], usage["prompt_tokens"]
            for _ in range(rng.randint(1, 3)):
                n += 1
                ask = messages + [{"role": "user", "content": MESSAGE.format(n=n)}]
                usage = _post(server.root, ask)
                # The client writes its own reply text: a random model's reply bytes need not
                # come back as the same text, and the history must only grow.
                messages = ask + [{"role": "assistant", "content": "Noted."}]
                last_prompt = usage["prompt_tokens"]
            if last_prompt > RESTART_AT:
                messages, last_prompt = [], 0  # a new conversation, before the context fills
            # One more request, killed at a random point of it (its prefill or its reply).
            n += 1
            body = json.dumps({"model": "tiny-llama", "messages": messages + [{"role": "user", "content": MESSAGE.format(n=n)}],
                               "max_tokens": 64, "temperature": 0})
            threading.Thread(target=_send_and_forget, args=(server.root, body), daemon=True).start()
            time.sleep(rng.uniform(0.0, 0.6))
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(timeout=60)
            # Nothing invalid on disk: a save the kill interrupted left only its temporary file.
            entries = KvStore(server.cache_dir, CachePolicy()).scan(deep=True)
            assert all(e.valid for e in entries), [(e.path, e.error) for e in entries if not e.valid]
    assert checked >= 5  # the guarantee was exercised past MIN_TOKENS, not only below it


def _send_and_forget(root: str, body: str) -> None:
    try:
        httpx.post(f"{root}/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                   timeout=60)
    except httpx.HTTPError:
        pass  # the server was killed under it
