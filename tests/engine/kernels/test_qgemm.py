"""qgemm.c: small-batch products over GGUF blocks, and the short prefill that uses them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ds4tui.engine.kernels import build, qgemm, qgemv
from ds4tui.engine.loader import load_model
from tests.engine.kernels.test_kernels import random_blocks, wide_model

pytestmark = pytest.mark.usefixtures("kernels")


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0", "q4_k", "bf16"])
@pytest.mark.parametrize("rows,cols,n", [(37, 256, 1), (37, 256, 5), (130, 768, 23), (4, 256, 7)])
def test_gemm_equals_the_dequantized_matmul(qtype, rows, cols, n):
    """The fp32 tiles (the bf16 ones: test_long_and_wide_..., test_one_hot_...)."""
    blocks = random_blocks(qtype, rows, cols, seed=rows + n)
    w = qgemv.dequantize(blocks, qtype, cols)
    x = torch.randn(n, cols, generator=torch.Generator().manual_seed(n))
    with qgemv.use_bf16(False):
        got = qgemm.make_blocks((qtype, blocks), w).matmul(x)
    want = x.double() @ w.double().T
    scale = (x.abs().double() @ w.abs().double().T).max()  # magnitude of the summed terms
    assert got.shape == (n, rows)
    assert ((got.double() - want).abs().max() / scale).item() < 1e-6


def bf16(t: torch.Tensor) -> torch.Tensor:
    """t rounded to bfloat16 (to nearest even, as vcvtne2ps2bf16), back in fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


def bf16_tiles(qtype: str, n: int) -> bool:
    """Whether a product of n rows takes the bf16 tiles when they are on (qgemm.c's rule)."""
    return n >= 96 or (qtype == "q4_1" and n >= 2)


# (variant, precision of long products): every variant in fp32, and the AVX-512 variant's bf16
# tiles (the `variant` fixture skips one this CPU lacks, `precision` bf16 without AVX512_BF16).
VARIANT_PRECISIONS = [(v, "fp32") for v in qgemv.ISAS] + [("avx512", "bf16")]


@pytest.fixture
def precision(request) -> str:
    if request.param == "bf16" and not qgemv.bf16_available():
        pytest.skip("needs a CPU with AVX-512 and AVX512_BF16")
    return request.param


@pytest.mark.parametrize("variant,precision", VARIANT_PRECISIONS, indirect=True)
@pytest.mark.parametrize("qtype,rows,cols,n", [
    ("q4_1", 37, 1536, 30),    # AVX-512 short tiles over two column panels
    ("q4_k", 70, 512, 100),    # long product: transposed 32-row chunks, a partial last chunk
    ("q6_k", 33, 2048, 250),   # long product: 8 column panels, two activation blocks
    ("q8_0", 40, 768, 517),    # a prefill chunk's size and more
    ("q4_1", 45, 576, 130),    # SmolLM2's width: 256-column dequantization passes and a 64-column rest
    ("bf16", 20, 328, 97),     # a rest of 72 columns: the transposed tile's 8-column masked end
    ("q2_k", 48, 2048, 130),   # DeepSeek V4 Flash's routed experts (ds4's Q2 file): down ...
    ("iq2_xxs", 40, 1024, 100),  # ... and gate/up
])
def test_long_and_wide_products_equal_the_dequantized_matmul(variant, qtype, rows, cols, n, precision):
    """The paths qgemm.c takes for many activation rows or wide rows, in every variant; with
    bf16 on, products on the bf16 tiles equal bf16(W) @ bf16(x) summed in fp32."""
    blocks = random_blocks(qtype, rows, cols, seed=n)
    w = qgemv.dequantize(blocks, qtype, cols)
    x = torch.randn(n, cols, generator=torch.Generator().manual_seed(rows))
    with qgemv.use_variant(variant), qgemv.use_bf16(precision == "bf16"):
        got = qgemm.make_blocks((qtype, blocks), w).matmul(x)
    rounded = precision == "bf16" and bf16_tiles(qtype, n)
    wr, xr = (bf16(w), bf16(x)) if rounded else (w, x)
    want = xr.double() @ wr.double().T
    scale = (x.abs().double() @ w.abs().double().T).max()
    assert ((got.double() - want).abs().max() / scale).item() < 1e-6
    if rounded:  # and it is not the fp32 product: bf16 rounding shows at this tolerance
        exact = x.double() @ w.double().T
        assert ((got.double() - exact).abs().max() / scale).item() > 1e-5


@pytest.mark.parametrize("variant,precision", VARIANT_PRECISIONS, indirect=True)
@pytest.mark.parametrize("qtype", ["q4_1", "q8_0"])
@pytest.mark.parametrize("n", [7, 23, 576])
def test_one_hot_products_are_the_dequantized_weights(variant, qtype, n, precision):
    """x = unit rows: each output is one weight times 1 plus zeros, so the product must
    return gguf's dequantized weights exactly, whatever tile or in-register dequantization
    (AVX-512 Q4_1: from regrouped quant bytes, inside the first tile) the path uses; on the
    bf16 tiles, those weights rounded to bf16 (1 and 0 are exact in bf16)."""
    rows, cols = 45, 576  # a partial second 32-row chunk: padding rows
    blocks = random_blocks(qtype, rows, cols, seed=n)
    w = qgemv.dequantize(blocks, qtype, cols)
    m = qgemm.make_blocks((qtype, blocks), w)
    eye = torch.eye(cols)
    with qgemv.use_variant(variant), qgemv.use_bf16(precision == "bf16"):
        got = torch.cat([m.matmul(eye[c0:c0 + n]) for c0 in range(0, cols, n)])
    want = torch.cat([bf16(w).T[c0:c0 + n] if precision == "bf16" and bf16_tiles(qtype, min(n, cols - c0))
                      else w.T[c0:c0 + n] for c0 in range(0, cols, n)])  # a 1-row rest is a GEMV: fp32
    assert torch.equal(got, want)


@pytest.mark.usefixtures("avx512_cpu")
def test_avx512_q4_1_rows_do_not_depend_on_how_many_are_multiplied():
    """AVX-512 Q4_1 products sum every output along its columns in one order, whether the
    first 12-activation tile dequantizes in registers alone (n <= 12) or also feeds the
    stored tiles of the rows after it: a row's result is the same bits at any n."""
    blocks = random_blocks("q4_1", 70, 1536, seed=3)
    m = qgemm.make_blocks(("q4_1", blocks), torch.empty(70, 1536))
    x = torch.randn(300, 1536, generator=torch.Generator().manual_seed(5))
    with qgemv.use_variant("avx512"), qgemv.use_bf16(False):
        full = m.matmul(x)
        for n in (2, 12, 23, 48):
            assert torch.equal(m.matmul(x[:n]), full[:n])


@pytest.mark.usefixtures("bf16_cpu")
@pytest.mark.parametrize("qtype", ["q4_k", "q4_1"])
def test_bf16_rows_do_not_depend_on_how_many_are_multiplied(qtype):
    """On the bf16 tiles each output is one sequential sum over the column pairs, whatever
    the number of rows, activation blocks or panels, and (Q4_1) whether the first tile
    dequantizes in registers alone or also feeds the tiles after it: the same bits."""
    blocks = random_blocks(qtype, 70, 2048, seed=4)
    m = qgemm.make_blocks((qtype, blocks), torch.empty(70, 2048))
    x = torch.randn(500, 2048, generator=torch.Generator().manual_seed(6))
    with qgemv.use_variant("avx512"), qgemv.use_bf16(True):
        full = m.matmul(x)
        for n in (96, 131, 241) + ((2, 12, 13, 18, 95) if qtype == "q4_1" else ()):
            assert torch.equal(m.matmul(x[:n]), full[:n]), n


def test_gemm_does_not_depend_on_the_thread_count(variant):
    blocks = random_blocks("q4_1", 1000, 512, seed=4)
    m = qgemm.make_blocks(("q4_1", blocks), torch.empty(1000, 512))
    before = torch.get_num_threads()
    for n in (23, 200):  # short tiles and long products
        x = torch.randn(n, 512)
        try:
            with qgemv.use_variant(variant):
                torch.set_num_threads(1)
                one = m.matmul(x)
                torch.set_num_threads(2)
                two = m.matmul(x)
        finally:
            torch.set_num_threads(before)
        assert torch.equal(one, two)


def test_gemm_rejects_bad_arguments():
    blocks = random_blocks("q8_0", 8, 64, seed=1)
    with pytest.raises(ValueError):
        qgemm.make_blocks(("q8_0", blocks), torch.empty(8, 96))  # blocks do not fit the shape
    with pytest.raises(ValueError):
        qgemm.make_blocks(("q8_0", blocks), torch.empty(9, 64))
    m = qgemm.make_blocks(("q8_0", blocks), torch.empty(8, 64))
    with pytest.raises(ValueError):
        m.matmul(torch.randn(3, 32))
    assert qgemm.make_blocks(("f32", blocks), torch.empty(8, 64)) is None  # fp32 stays torch


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0", "q4_k_m"])
def test_short_prefill_through_the_blocks_matches_fp32(qtype):
    tiny = load_model("tiny-llama")
    model = wide_model(tiny.tokenizer, tiny.chat, qtype)
    assert all(getattr(layer, n).blocks is not None for layer in model.layers for n in ("wqkv", "wo", "w13", "w2"))
    tokens = torch.randint(0, model.cfg.vocab_size, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = model.new_session(128, kv_dtype="f32")  # f32 rows: the products alone are compared
    with qgemv.use_bf16(False):  # the fp32 tiles (Q4_1 would take bf16 ones on such a CPU)
        ref.prefill(tokens[:40])  # 40 rows: the block path
    kv = ref.kv.clone()
    with torch.inference_mode(), qgemv.use_bf16(False):
        got = model.forward(kv, tokens[40:], 40, True)  # 20 rows through the blocks
        fast, model.fast = model.fast, None  # all-torch fp32, same weight values
        want = model.forward(ref.kv, tokens[40:], 40, True)
        model.fast = fast
    assert ((got - want).abs().max() / want.abs().max()).item() < 2e-5
    assert torch.allclose(kv[..., 40:60, :], ref.kv[..., 40:60, :], atol=1e-4, rtol=1e-4)


BF16_SCRIPT = """
import torch
from ds4tui.engine.kernels import qgemm, qgemv
from tests.engine.kernels.test_kernels import random_blocks
m = qgemm.make_blocks(("q8_0", random_blocks("q8_0", 40, 512, seed=1)), torch.empty(40, 512))
x = torch.randn(128, 512, generator=torch.Generator().manual_seed(2))
w = m.dequantize()
exact = (m.matmul(x).double() - x.double() @ w.double().T).abs().max() < 1e-6 * (x.abs() @ w.abs().T).max()
print(qgemv.bf16_products(), bool(exact))
"""


@pytest.mark.parametrize("setting", ["", "off", "on"])
def test_the_environment_sets_bf16_products(setting):
    """DS4TUI_BF16: unset (auto) takes bf16 where the CPU has it, off keeps fp32 everywhere,
    on insists (no AVX512_BF16: the kernels are not used at all, and the reason says why)."""
    env = dict(os.environ, DS4TUI_BF16=setting)
    root = str(Path(__file__).resolve().parents[3])  # the repository: `tests` importable
    script = BF16_SCRIPT if setting != "on" or qgemv.bf16_available() else (
        "from ds4tui.engine.kernels import qgemv; print(qgemv.backend(), qgemv.backend_reason())")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=root,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if setting == "on" and not qgemv.bf16_available():
        assert proc.stdout.startswith("torch") and "AVX512_BF16" in proc.stdout
        return
    bf16 = qgemv.bf16_available() and setting != "off"
    assert proc.stdout.split() == [str(bf16), str(not bf16)]


def test_a_bad_bf16_setting_is_refused(monkeypatch):
    monkeypatch.setenv("DS4TUI_BF16", "maybe")
    monkeypatch.setattr(qgemv, "_backend", None)
    monkeypatch.setattr(qgemv, "_lib", None)
    with pytest.raises(ValueError, match="DS4TUI_BF16"):
        qgemv.backend()
    monkeypatch.undo()
    assert qgemv.backend() != "torch" or build.find_compiler() is None
