"""RoPE scaling of the llama family: the kinds a model file can name, and the cos/sin tables.

Owns reading the scaling a GGUF's `{arch}.rope.scaling.*` keys describe (the way llama.cpp
reads them) and the one a config.json's rope_scaling / rope_parameters describes (the way
transformers' modeling_rope_utils reads it), and turning either into one form: a divisor per
frequency of the global layers (the `rope_freqs` tensor of the converted layout) and a factor
on their cos/sin (YaRN's attention factor: config.rope_attn_factor). The tables built from
that form are what the torch forward and the C kernels (llama_step.c, chunk.c, rows.c) all
read, so every path rotates by the same numbers.

Kinds: none, linear (every frequency divided by the factor), yarn (low frequencies
interpolated, high ones kept, a ramp between; cos/sin scaled by 0.1 ln(factor) + 1 unless the
file names the factor), llama3 (a smooth blend by wavelength; in a GGUF it is the
`rope_freqs` tensor llama.cpp's converter writes, since llama.cpp has no scaling type of
that name). Sliding-window layers (Gemma 3) keep their own base unscaled: llama.cpp scales
them by rope_freq_scale_train_swa = 1, transformers by their "sliding_attention"
parameters, which a Gemma 3 config leaves at the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from ds4tui.engine.errors import WeightsError

# What each format can name (the unsupported ones are refused naming the key and value).
GGUF_KINDS = ("none", "linear", "yarn")  # + llama3 as a rope_freqs tensor
HF_KINDS = ("default", "linear", "llama3", "yarn")
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # the paper's, transformers' and llama.cpp's defaults


@dataclass(frozen=True)
class RopeScaling:
    """The scaling of the global layers: `divisors` [D/2] divide the frequencies (None: the
    file's own rope_freqs tensor is all there is) and `attn_factor` multiplies cos and sin."""

    kind: str
    factor: float
    divisors: tuple[float, ...] | None
    attn_factor: float = 1.0
    original_context: int = 0  # yarn, llama3: the context the model was pretrained at

    def describe(self) -> str:
        """Words for the model info line, e.g. "RoPE yarn x4 from 32768"."""
        if self.kind == "rope_freqs":
            return "RoPE scaled by rope_freqs (Llama 3)"
        text = f"RoPE {self.kind} x{self.factor:g}"
        return text + (f" from {self.original_context}" if self.original_context else "")


def linear_divisors(head_dim: int, factor: float) -> list[float]:
    """Linear (position interpolation): every frequency divided by `factor`."""
    return [factor] * (head_dim // 2)


def llama3_divisors(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                    high_freq_factor: float, original_context: int) -> list[float]:
    """Llama 3.x scaling as one divisor per frequency (what llama.cpp's converter writes as the
    `rope_freqs` tensor): long wavelengths are divided by `factor`, short ones kept, and the
    band between blends the two smoothly."""
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def yarn_divisors(head_dim: int, theta: float, factor: float, original_context: int,
                  beta_fast: float = YARN_BETA_FAST, beta_slow: float = YARN_BETA_SLOW,
                  truncate: bool = True) -> list[float]:
    """YaRN's frequencies as divisors of the unscaled ones: frequency i turns less than
    beta_slow times over the original context -> divided by `factor` (interpolated), more than
    beta_fast times -> kept (extrapolated), a linear ramp in i between. The correction range is
    transformers' find_correction_range (floor/ceil when `truncate`), which is ggml's
    ggml_rope_yarn_corr_dims."""
    def dim_of(rotations: float) -> float:
        return head_dim * math.log(original_context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    out = []
    for i in range(head_dim // 2):
        interpolated = min(1.0, max(0.0, (i - low) / (high - low)))  # share of the frequency / factor
        out.append(1.0 / (interpolated / factor + (1.0 - interpolated)))
    return out


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor (Eq. 21 of the paper): 0.1 mscale ln(factor) + 1, 1 when not stretched."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def combined_divisors(scaling: RopeScaling | None, file_divisors, source: str = "GGUF") -> list[float] | None:
    """The divisors of the global layers: a file's rope_freqs tensor (Llama 3) times those of
    the scaling its keys name, as ggml applies both (freq_factors, then freq_scale / YaRN)."""
    if file_divisors is None:
        return None if scaling is None or scaling.divisors is None else list(scaling.divisors)
    out = [float(v) for v in file_divisors]
    if not all(math.isfinite(v) and v > 0 for v in out):
        raise WeightsError(f"{source}: the rope_freqs tensor holds a divisor that is not a positive number")
    if scaling is not None and scaling.divisors is not None:
        out = [a * b for a, b in zip(out, scaling.divisors)]
    return out


def rope_tables(head_dim: int, positions: int, theta: float, divisors=None,
                attn_factor: float = 1.0):
    """cos/sin [positions, D/2] computed the way transformers does (float32 inv_freq x
    position, then cos and sin times the attention factor); `divisors` [D/2] divide the
    frequencies."""
    import torch

    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if divisors is not None:
        inv_freq = inv_freq / torch.as_tensor(divisors, dtype=torch.float32)
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    if attn_factor != 1.0:
        cos, sin = cos * attn_factor, sin * attn_factor
    return cos.contiguous(), sin.contiguous()


# ---------------------------------------------------------------- GGUF

Number = Callable[..., float]


def gguf_rope_scaling(number: Number, text: Callable[..., str | None], integer: Callable[..., int],
                      prefix: str, head_dim: int, theta: float, n_ctx_train: int,
                      source: str) -> RopeScaling | None:
    """The scaling a GGUF's keys describe, as llama.cpp reads them (llama_model::load_hparams):
    `rope.scaling.type` defaults to linear, whose factor (`rope.scaling.factor`, or the old
    `rope.scale_linear`) defaults to 1, i.e. none; "none" never scales. YaRN reads
    `rope.scaling.original_context_length` (default: the training context) and the
    `rope.scaling.yarn_*` keys llama.cpp's converter writes from the config (beta_fast,
    beta_slow, attn_factor: transformers' attention_factor). number/text/integer(key, default)
    read one key typed, raising WeightsError; `prefix` is "{arch}."."""
    def key(name: str) -> str:
        return prefix + name

    kind = text(key("rope.scaling.type"), None)
    factor = number(key("rope.scaling.factor"), None)
    if factor is None:
        factor = number(key("rope.scale_linear"), 0.0)
    if factor < 0 or not math.isfinite(factor):
        raise WeightsError(f"{source}: {key('rope.scaling.factor')} = {factor!r} is not a positive factor")
    factor = factor or 1.0  # llama.cpp: 0 (or absent) means 1
    attn = number(key("rope.scaling.attn_factor"), 1.0)
    if attn != 1.0:
        raise WeightsError(f"{source}: {key('rope.scaling.attn_factor')} = {attn!r} is not supported (1 only)")
    if kind is None:
        kind = "linear"
    if kind == "none" or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return RopeScaling("linear", factor, tuple(linear_divisors(head_dim, factor)))
    if kind == "yarn":
        orig = integer(key("rope.scaling.original_context_length"), n_ctx_train)
        if orig <= 0:
            raise WeightsError(f"{source}: {key('rope.scaling.original_context_length')} = {orig} is not a positive length")
        for name, default in (("yarn_ext_factor", 1.0), ("yarn_log_multiplier", 0.0)):
            value = number(key(f"rope.scaling.{name}"), default)
            if value != default:
                raise WeightsError(f"{source}: {key('rope.scaling.' + name)} = {value!r} is not supported ({default:g} only)")
        fast = number(key("rope.scaling.yarn_beta_fast"), YARN_BETA_FAST)
        slow = number(key("rope.scaling.yarn_beta_slow"), YARN_BETA_SLOW)
        mscale = number(key("rope.scaling.yarn_attn_factor"), None)
        return _yarn(head_dim, theta, factor, orig, fast, slow, mscale, True, prefix + "rope.scaling", source)
    raise WeightsError(f"{source}: {key('rope.scaling.type')} = {kind!r} is not supported "
                       f"({', '.join(GGUF_KINDS)}; llama3 as a rope_freqs tensor)")


def _yarn(head_dim: int, theta: float, factor: float, orig: int, fast: float, slow: float,
          mscale: float | None, truncate: bool, where: str, source: str) -> RopeScaling:
    if not theta > 1:
        raise WeightsError(f"{source}: yarn needs a RoPE base above 1, got {theta!r}")
    if not (fast > 0 and slow > 0 and math.isfinite(fast) and math.isfinite(slow)):
        raise WeightsError(f"{source}: {where} yarn betas {fast!r}, {slow!r} must be positive")
    if mscale is None:
        mscale = yarn_mscale(factor)
    if not (mscale > 0 and math.isfinite(mscale)):
        raise WeightsError(f"{source}: {where} yarn attention factor {mscale!r} must be positive")
    return RopeScaling("yarn", factor, tuple(yarn_divisors(head_dim, theta, factor, orig, fast, slow, truncate)),
                       mscale, orig)


# ---------------------------------------------------------------- config.json


def hf_rope_scaling(rope: Mapping | None, head_dim: int, theta: float, max_positions: int,
                    where: str, source: str) -> RopeScaling | None:
    """The scaling of a rope_scaling / rope_parameters dict as transformers computes it
    (modeling_rope_utils: _compute_linear_scaling_rope_parameters, _compute_llama3_parameters,
    _compute_yarn_parameters); `where` names the dict in errors ("rope_scaling")."""
    if not rope:
        return None
    if not isinstance(rope, Mapping):
        raise WeightsError(f"{source}: {where} is {rope!r}, not a mapping")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("default", "none", None):
        return None

    def num(name: str, default=None) -> float:
        value = rope.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise WeightsError(f"{source}: {where}.{name} = {value!r} is not a number")
        return float(value)

    def positive(name: str, default=None) -> float:
        value = num(name, default)
        if value <= 0:
            raise WeightsError(f"{source}: {where}.{name} = {value!r} must be positive")
        return value

    if kind == "linear":
        factor = positive("factor")
        return None if factor == 1.0 else RopeScaling("linear", factor, tuple(linear_divisors(head_dim, factor)))
    if kind == "llama3":
        factor, low, high = positive("factor"), positive("low_freq_factor"), positive("high_freq_factor")
        orig = int(positive("original_max_position_embeddings"))
        if low == high:
            raise WeightsError(f"{source}: {where} low_freq_factor and high_freq_factor are both {low!r}")
        return RopeScaling("llama3", factor, tuple(llama3_divisors(head_dim, theta, factor, low, high, orig)),
                           1.0, orig)
    if kind == "yarn":
        orig = int(positive("original_max_position_embeddings", max_positions))
        factor = positive("factor", max_positions / orig) if rope.get("factor") is not None else max_positions / orig
        attention = rope.get("attention_factor")
        if attention is None:
            mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
            if mscale and mscale_all:
                attention = yarn_mscale(factor, num("mscale")) / yarn_mscale(factor, num("mscale_all_dim"))
        else:
            attention = positive("attention_factor")
        fast = positive("beta_fast") if rope.get("beta_fast") else YARN_BETA_FAST  # transformers: `or 32`
        slow = positive("beta_slow") if rope.get("beta_slow") else YARN_BETA_SLOW
        return _yarn(head_dim, theta, factor, orig, fast, slow, attention, bool(rope.get("truncate", True)),
                     where, source)
    raise WeightsError(f"{source}: {where}.rope_type = {kind!r} is not supported ({', '.join(HF_KINDS)})")
