"""The decode speed a reply reports (the chat's stats line) covers sampling, and the
`bench engine` runs that put greedy and sampled decode side by side. No timing is asserted
beyond what a deliberately slow sampler must cause (a lower bound a busy machine only raises)."""

from __future__ import annotations

import json
import time

from ds4tui.bench.engine_bench import measure_engine
from ds4tui.cli import main
from ds4tui.engine import sampling
from ds4tui.screens.chat_notices import stats_line
from ds4tui.screens.widgets import fmt
from tests.chat.conftest import make_controller

PAUSE_S = 0.01


def test_reply_speed_includes_the_time_spent_sampling(tiny_llama, tmp_path, monkeypatch, recorder):
    real = sampling.Sampler.__call__

    def slow(self, logits):
        # CPU work, not a sleep: the reply counts the sampler's CPU time (its waits for the
        # GIL while a UI renders are not the sampler's cost)
        end = time.thread_time() + PAUSE_S
        while time.thread_time() < end:
            pass
        return real(self, logits)

    monkeypatch.setattr(sampling.Sampler, "__call__", slow)
    ctl = make_controller(tiny_llama, tmp_path, temperature=0.7, seed=1, max_tokens=6, no_disk_cache=True)
    done = ctl.send(ctl.new_conversation().key, "Hello there", recorder)
    assert done is not None and done.tokens > 0
    assert done.tok_s <= 1.0 / PAUSE_S  # every generated token waited for its sampler
    # ...and the reply says how much of its decode time that was (the stats line shows it)
    assert done.sampled is True and done.sampler_ms >= done.tokens * PAUSE_S * 1000.0
    # The share is the sampler's CPU time over the decode's wall time: on a busy machine the
    # wall time grows and the share shrinks, so only its bounds and its display are asserted.
    line = stats_line(done)
    share = done.sampler_ms / (done.tokens / done.tok_s * 1000.0)
    assert 0 < share <= 1 and f"tok/s sampled (sampler {fmt.share(share)})" in line


def test_the_samplers_share_counts_its_cpu_not_its_waits(tiny_llama, tmp_path, monkeypatch, recorder):
    """A sampler that waits (as it does for the GIL while the app's UI renders) slows the reply,
    but the wait is not sampling: the stats line's share is the sampler's CPU time."""
    real = sampling.Sampler.__call__

    def waits(self, logits):
        time.sleep(PAUSE_S)
        return real(self, logits)

    monkeypatch.setattr(sampling.Sampler, "__call__", waits)
    ctl = make_controller(tiny_llama, tmp_path, temperature=0.7, seed=1, max_tokens=6, no_disk_cache=True)
    done = ctl.send(ctl.new_conversation().key, "Hello there", recorder)
    assert done is not None and done.tokens > 0 and done.tok_s <= 1.0 / PAUSE_S
    assert done.sampler_ms < done.tokens * PAUSE_S * 1000.0 / 2


def test_a_greedy_reply_says_so_on_its_stats_line(tiny_llama, tmp_path, recorder):
    ctl = make_controller(tiny_llama, tmp_path, max_tokens=4, no_disk_cache=True)
    done = ctl.send(ctl.new_conversation().key, "Hello there", recorder)
    assert done is not None and done.sampled is False
    assert "tok/s greedy" in stats_line(done) and "sampler" not in stats_line(done)


def test_bench_engine_reports_greedy_and_sampled_decode(capsys):
    r = measure_engine("tiny-llama", prompt_tokens=16, decode_tokens=4, repeats=2, chat_tokens=5)
    assert r.decode_tok_s > 0 and r.sampled_decode_tok_s > 0 and r.sampled_over_greedy > 0
    assert r.chat is not None and r.chat["rounds"] == 2 and r.chat["max_tokens"] == 5
    assert r.chat["greedy_tok_s"] > 0 and r.chat["sampled_tok_s"] > 0 and r.chat["sampled_over_greedy"] > 0
    assert len(r.chat["greedy_runs"]) == len(r.chat["sampled_runs"]) == 2
    assert 0 < r.chat["greedy_tokens"] <= 5 and 0 < r.chat["sampled_tokens"] <= 5
    args = ["bench", "engine", "--model", "tiny-llama", "--prompt-tokens", "8", "--decode-tokens", "2",
            "--repeats", "1", "--chat-tokens", "3"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampled_decode_tok_s"] > 0 and out["chat"]["sampled_tok_s"] > 0
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "greedy" in table and "sampled" in table and "through the controller" in table
