"""`ds4tui bench serve --shared-prefix` on tiny-llama: its cache goals (what each request reused),
not its times (a benchmark's, on whatever machine runs it)."""

from __future__ import annotations

import argparse
import json

from ds4tui.bench.shared_prefix_bench import run_shared_prefix, system_prompt


def test_every_request_after_the_first_reuses_the_system_turn(capsys, tiny_llama):
    args = argparse.Namespace(model="tiny-llama", clients="3", prefix_tokens=600, max_tokens=4,
                              live_sessions=2, json=True)
    assert run_shared_prefix(args) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert [r["what"] for r in rows] == ["first (cold)", "client 2 (at once)", "client 3 (at once)",
                                         "client 2's prompt again", "after a restart"]
    assert rows[0]["cached_tokens"] == 0 and out["shared_prefix_tokens"] >= 600
    assert all(r["ok_cached"] for r in rows[1:]), rows
    again = rows[3]
    assert again["cached_tokens"] >= again["prompt_tokens"] - 1


def test_the_system_prompt_has_the_tokens_asked_for(tiny_llama):
    text = system_prompt(tiny_llama.tokenizer, 300)
    assert len(tiny_llama.tokenizer.encode(text)) >= 300
    assert system_prompt(tiny_llama.tokenizer, 300) == text  # the same prompt every run
