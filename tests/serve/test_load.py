"""Load: 8 clients x 20 multi-turn requests at once against `ds4tui serve` (4 decoded together).
Every request is answered or refused with 429, none is lost or mixed up: each reply equals
the embedded engine's greedy reply to the same conversation, alone. The cache hit rate is
printed (pytest -s) and must show the reuse."""

from __future__ import annotations

import threading
import time

import openai
import pytest

pytestmark = pytest.mark.slow  # 160 requests: about a minute on 2 cores

CLIENTS = 8
TURNS = 20
MAX_TOKENS = 4
DEADLINE_S = 900.0  # a hang guard, not a speed: the suite runs on busy machines too


def _client_run(url: str, c: int, out: dict, errors: list) -> None:
    api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
    messages: list[dict] = []
    replies, refused, cached, prompt = [], 0, 0, 0
    try:
        for t in range(TURNS):
            messages.append({"role": "user", "content": f"client {c} turn {t}: what comes next?"})
            for _attempt in range(5):  # a 429 is retried after its Retry-After (bounded)
                try:
                    r = api.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=MAX_TOKENS,
                                                    temperature=0)
                    break
                except openai.RateLimitError as exc:
                    refused += 1
                    time.sleep(min(2.0, float(exc.response.headers.get("retry-after", "1"))))
            else:
                raise AssertionError(f"client {c} turn {t}: refused 5 times")
            reply = r.choices[0].message.content
            replies.append(reply)
            messages.append({"role": "assistant", "content": reply})
            cached += r.usage.prompt_tokens_details.cached_tokens
            prompt += r.usage.prompt_tokens
    except Exception as exc:  # reported by the test, not lost in the thread
        errors.append(f"client {c}: {type(exc).__name__}: {exc}")
    out[c] = {"replies": replies, "refused": refused, "cached": cached, "prompt": prompt}


def test_eight_clients_twenty_turns(server, tiny_llama):
    from tests.serve.conftest import reference_replies

    out: dict = {}
    errors: list = []
    before = server.health()
    threads = [threading.Thread(target=_client_run, args=(server.url, c, out, errors), daemon=True)
               for c in range(CLIENTS)]
    started = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=max(1.0, DEADLINE_S - (time.perf_counter() - started)))
    wall = time.perf_counter() - started
    assert not any(th.is_alive() for th in threads), "a client did not finish in time"
    assert errors == []

    # The reference: each conversation's requests (as its client sent them) on the embedded
    # engine, greedy, alone.
    for c in range(CLIENTS):
        conversation, requests = [], []
        for t in range(TURNS):
            conversation.append({"role": "user", "content": f"client {c} turn {t}: what comes next?"})
            requests.append(list(conversation))
            conversation.append({"role": "assistant", "content": out[c]["replies"][t]})
        expected = reference_replies(tiny_llama, requests, MAX_TOKENS)
        assert out[c]["replies"] == expected, f"client {c} got someone else's or a wrong reply"

    state = server.health()
    answered = state["served"] - before["served"]
    refused = sum(o["refused"] for o in out.values())
    assert answered == CLIENTS * TURNS and state["refused"] - before["refused"] == refused
    cached, prompt = sum(o["cached"] for o in out.values()), sum(o["prompt"] for o in out.values())
    print(f"\nload: {CLIENTS}x{TURNS} requests in {wall:.1f} s, {refused} refused (429),"
          f" cache hit rate {cached / prompt:.1%} ({cached}/{prompt} prompt tokens)")
    assert cached / prompt > 0.5
    # The requests ran together: the scheduler's steps held several decodes on average.
    assert state["batch_mean"] > 1.0, state
