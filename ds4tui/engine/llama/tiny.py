"""tiny-llama: a seeded random llama checkpoint in Hugging Face layout, built on first use.

Owns the recipe (config, seed, weight scales, ChatML tokenizer and template) and
writing it once to `data_dir()/models/tiny-llama`. The directory is assembled in a
temp dir beside the target and renamed into place, so concurrent first uses are
safe: the first rename wins and the others discard their copy. The weights are
deterministic for a given RECIPE_VERSION; bump it when the recipe changes (the
directory name carries it, so an old build is never mistaken for a new one).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ds4tui import paths
from ds4tui.engine.text.hf_tokenizer import ENDOFTEXT, IM_END, IM_START
from ds4tui.engine.text.tiny_tokenizer import train_tiny_tokenizer

if TYPE_CHECKING:  # torch loads only when a build runs: `ds4tui models list` stays fast
    import torch

RECIPE_VERSION = 1
SEED = 20261129
SPECIALS = [ENDOFTEXT, IM_START, IM_END]  # ids 0, 1, 2, like SmolLM2's
DEFAULT_SYSTEM = "You are a tiny test model."
VOCAB = 512
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    # Untied: with a tied head and random weights, greedy decoding mostly repeats its input.
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
# The same template shape as SmolLM2-135M-Instruct's (default system prompt on loop.first).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_llama_dir() -> Path:
    return paths.models_dir() / f"tiny-llama-v{RECIPE_VERSION}"


def ensure_tiny_llama() -> Path:
    """The checkpoint directory, built (seeded, once) if missing."""
    target = tiny_llama_dir()
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=target.parent))
    try:
        build_tiny_llama(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise  # not a lost race: a real failure
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def random_llama_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """HF-named float32 weights. Scales are chosen so activations stay O(1) and the logits are
    peaked enough that greedy output varies with the prompt instead of collapsing to one token."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    h, f = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = h // heads

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).contiguous()

    def norm(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=gen)).contiguous()

    w = {"model.embed_tokens.weight": rnd(config["vocab_size"], h, scale=1.0)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = rnd(heads * d, h, scale=2.0 / h**0.5)
        w[p + "self_attn.k_proj.weight"] = rnd(kv_heads * d, h, scale=2.0 / h**0.5)
        w[p + "self_attn.v_proj.weight"] = rnd(kv_heads * d, h, scale=1.0 / h**0.5)
        w[p + "self_attn.o_proj.weight"] = rnd(h, heads * d, scale=1.0 / (heads * d) ** 0.5)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = rnd(f, h, scale=1.0 / h**0.5)
        w[p + "mlp.up_proj.weight"] = rnd(f, h, scale=1.0 / h**0.5)
        w[p + "mlp.down_proj.weight"] = rnd(h, f, scale=1.0 / f**0.5)
    w["model.norm.weight"] = norm(h)
    if not config.get("tie_word_embeddings"):
        w["lm_head.weight"] = rnd(config["vocab_size"], h, scale=3.0 / h**0.5)
    return w


def build_tiny_llama(out: Path) -> None:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json into `out`."""
    tok = train_tiny_tokenizer(SPECIALS, vocab_size=VOCAB)
    if tok.get_vocab_size() != VOCAB or [tok.token_to_id(s) for s in SPECIALS] != [0, 1, 2]:
        raise RuntimeError("tiny tokenizer did not come out at the expected size / special ids")
    from safetensors.torch import save_file

    save_file(random_llama_weights(CONFIG, SEED), str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    tokenizer_config = {
        "bos_token": None,
        "eos_token": IM_END,
        "chat_template": CHAT_TEMPLATE,
        "add_bos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
