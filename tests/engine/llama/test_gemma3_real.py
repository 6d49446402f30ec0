"""The real Gemma 3 270M Q4_K_M GGUF (pulled by `make test`) against llama.cpp on the same file.

tests/engine/data/llama_cpp_gemma3.json holds what llama.cpp produced: token ids of a few
strings, and greedy steps with their top-5 log-probabilities. We must give the same ids,
and the same top-1 token at every step. Where llama.cpp's own top two tokens are within
NEAR_TIE of each other the two engines may order them either way: llama.cpp multiplies
with 8-bit-quantized activations, we compute in fp32 (K/V in f16 like llama.cpp's, or f32), and their
log-probabilities differ by ~0.05 on average, up to ~0.3. Those steps only require
llama.cpp's pick among our top two.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ds4tui.engine.errors import ModelNotFoundError
from ds4tui.engine.loader import load_model

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("one_torch_thread")]

REFERENCE = json.loads((Path(__file__).parent / "data" / "llama_cpp_gemma3.json").read_text())
NEAR_TIE = 0.2
BOS = 2


@pytest.fixture(scope="module")
def gemma(one_torch_thread):  # batch-1 steps: see conftest.py
    try:
        return load_model("gemma3-270m")
    except ModelNotFoundError as exc:
        pytest.fail(f"{exc} (`make test` does this before running the tests)")


def test_it_is_the_gemma3_file(gemma):
    cfg = gemma.cfg
    assert (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.sliding_window) == ("gemma3", 18, 640, 512)
    assert [i for i in range(18) if not cfg.is_sliding(i)] == [5, 11, 17]
    line = gemma.describe()
    assert "gemma3" in line and "Q4_K" in line and "15 sliding (window 512) + 3 global" in line
    assert "built in" in line  # a base model: no template in the file, the Gemma turn format stands in
    assert "decode: fused C step" in line and gemma.fast is not None


@pytest.mark.parametrize("text", list(REFERENCE["tokenize"]))
def test_token_ids_equal_llama_cpp(gemma, text):
    ids = gemma.tokenizer.encode(text)
    assert ids == REFERENCE["tokenize"][text]
    assert gemma.tokenizer.decode(ids) == text
    assert b"".join(gemma.tokenizer.token_bytes(i) for i in ids) == text.encode()


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("case", REFERENCE["completions"], ids=lambda c: c["prompt"][:24])
def test_greedy_steps_equal_llama_cpp(gemma, case, kv_dtype):
    assert [BOS] + gemma.tokenizer.encode(case["prompt"]) == case["prompt_ids"]
    s = gemma.new_session(256, kv_dtype=kv_dtype)
    s.prefill(case["prompt_ids"])
    for step in case["steps"]:
        (first, lp_first), (second, lp_second) = step["top"][:2]
        ours = torch.log_softmax(s.logits.double(), -1)
        if lp_first - lp_second >= NEAR_TIE:
            assert int(ours.argmax()) == first
        else:
            assert first in ours.topk(2).indices.tolist()
        assert abs(float(ours[first]) - lp_first) < 0.35
        s.decode(step["token"])


def test_chat_renders_gemma_turns(gemma):
    text = gemma.chat.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert gemma.tokenizer.encode(text)[:2] == [BOS, 105]  # <bos> and <start_of_turn> are single ids
    assert gemma.tokenizer.token_to_id("<end_of_turn>") in gemma.tokenizer.eos_ids
    assert gemma.chat.render(gemma.chat.parse(text), add_generation_prompt=True) == text
