"""`ds4tui bench engine` on tiny-dsv4: the measured run is real (exact restore, the payload
size of the formula) and the command prints a table or JSON. No timing is asserted."""

from __future__ import annotations

import json

from ds4tui.bench.engine_bench import measure_engine
from ds4tui.cli import main
from tests.engine.dsv4.dsv4_helpers import expected_size, single_thread, tiny  # noqa: F401 (fixture)


def test_measure_engine_on_tiny_dsv4():
    r = measure_engine("tiny-dsv4", prompt_tokens=64, decode_tokens=4, repeats=1)
    assert r.family == "dsv4" and r.restore_exact
    assert r.payload_bytes == expected_size(tiny().cfg, 68)
    assert r.payload_bytes_per_token == round(r.payload_bytes / 68, 1)
    assert min(r.prefill_tok_s, r.decode_tok_s, r.save_mb_s, r.load_mb_s) > 0
    assert r.kernels == "torch" and r.weights == "fp32 (not a GGUF)"  # the V4 engine runs no C kernels


def test_bench_engine_cli(capsys):
    args = ["bench", "engine", "--model", "tiny-dsv4", "--prompt-tokens", "32", "--decode-tokens", "2", "--repeats", "1"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "tiny-dsv4" and out["prompt_tokens"] == 32 and out["restore_exact"] is True
    assert {"prefill_tok_s", "decode_tok_s", "payload_bytes_per_token", "save_mb_s", "load_mb_s"} <= set(out)
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "prefill" in table and "bytes/token" in table and "exact" in table
    assert main(["bench", "engine", "--model", "no-such-model"]) == 1
    assert "no-such-model" in capsys.readouterr().err
