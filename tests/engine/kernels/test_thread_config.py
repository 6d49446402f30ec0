"""The kernel configuration is the calling thread's: a variant or bf16 choice made in one thread
(qgemv.use_variant, use_bf16) never reaches another, and the library refuses a configuration
word the CPU cannot run.

The stress test runs two threads on different configurations at once (portable C and the widest
vector variant; where the CPU has AVX512_BF16 also the AVX-512 variant with and without bf16
products), their calls interleaving on the kernel lock, for ROUNDS rounds; every result must be
bit-identical to the one the same configuration computed alone beforehand. The two references
differ (asserted), so a call that ran on the other thread's configuration would show.
"""

from __future__ import annotations

import threading

import pytest
import torch

from ds4tui.engine.kernels import attn, qgemv
from tests.engine.kernels.test_kernels import random_blocks, wide_model

pytestmark = pytest.mark.usefixtures("kernels")

ROUNDS = 100
PROMPT = 100  # a chunk forward (C layers: gemm, attention, rows), then one fused decode step


def test_a_variant_chosen_in_one_thread_stays_there():
    widest = qgemv.variants()[-1]
    seen = {}

    def other(tag: str) -> None:
        seen[tag] = qgemv.backend()

    with qgemv.use_variant("scalar"):
        t = threading.Thread(target=other, args=("inside",))
        t.start()
        t.join()
        assert qgemv.backend() == "scalar"
        with qgemv.use_variant(widest), qgemv.use_bf16(False):
            assert qgemv.backend() == widest and not qgemv.config() & qgemv.CFG_BF16
        assert qgemv.backend() == "scalar"
    assert seen["inside"] == qgemv.backend() == widest  # the default: the widest this CPU runs


def test_the_library_refuses_a_configuration_the_cpu_cannot_run(kernels):
    m = qgemv.QuantMatrix(random_blocks("q8_0", 4, 64, seed=1), "q8_0", 64)
    x, y = torch.randn(64), torch.empty(4)

    def gemv(cfg: int) -> int:
        return kernels.ds4k_gemv(cfg, m._mats, 1, x.data_ptr(), y.data_ptr(), 64, 1)

    best = kernels.ds4k_best_isa()
    assert gemv(best) == 0 and gemv(0) == 0
    assert gemv(0x200) == -1  # a bit that means nothing
    if best < len(qgemv.ISAS) - 1:
        assert gemv(best + 1) == -1
    if not kernels.ds4k_cpu_bf16():
        assert gemv(best | qgemv.CFG_BF16) == -1
        with pytest.raises(ValueError, match="AVX512_BF16"):
            qgemv.use_bf16(True)


def _workload(tiny):
    model = wide_model(tiny.tokenizer, tiny.chat, "q4_1")
    assert model.fast is not None and model.use_c_layers
    tokens = torch.randint(0, model.cfg.vocab_size, (PROMPT + 1,), generator=torch.Generator().manual_seed(2)).tolist()
    mat = qgemv.QuantMatrix(random_blocks("q4_1", 256, 512, seed=3), "q4_1", 512)
    x = torch.randn(120, 512, generator=torch.Generator().manual_seed(4))  # over 96 rows: bf16 tiles where on
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(8, 4, 64, generator=gen)
    k, v = (torch.randn(1, 608, 64, generator=gen).half() for _ in range(2))  # 608 keys: bf16 attention where on

    def run() -> list[torch.Tensor]:
        with torch.inference_mode():
            session = model.new_session(PROMPT + 8)
            chunk = model.forward(session.kv, tokens[:PROMPT], 0, True)
            step = model.fast.step(session.kv, tokens[PROMPT], PROMPT, want_logits=True)
            return [mat.matmul(x), attn.attend(q, k, v, qpos=600, kbase=608, scale=0.125), chunk, step]

    return run


def _pairs() -> list[tuple[tuple[str, bool], tuple[str, bool]]]:
    """(variant, bf16) pairs that compute different bits: portable C against the widest
    variant (bf16 on where the CPU has it), and bf16 against fp32 on AVX-512."""
    variants = qgemv.variants()
    bf16 = qgemv.bf16_available()
    pairs = [(("scalar", False), (variants[-1], bf16))] if len(variants) > 1 else []
    if bf16:
        pairs.append((("avx512", False), ("avx512", True)))
    return pairs


@pytest.mark.slow
def test_two_threads_on_different_configurations_compute_their_own_results(tiny_llama):
    pairs = _pairs()
    if not pairs:
        pytest.skip(f"this CPU runs only {qgemv.variants()}: no second configuration")
    run = _workload(tiny_llama)
    for pair in pairs:
        refs = []
        for variant, bf16 in pair:
            with qgemv.use_variant(variant), qgemv.use_bf16(bf16):
                refs.append(run())
        for a, b in zip(*refs):  # every output tells the two configurations apart
            assert not torch.equal(a, b), pair
        failures: list[str] = []
        start = threading.Barrier(len(pair))

        def worker(config: tuple[str, bool], ref: list[torch.Tensor]) -> None:
            try:
                with qgemv.use_variant(config[0]), qgemv.use_bf16(config[1]):
                    start.wait()
                    for r in range(ROUNDS):
                        got = run()
                        bad = [i for i, (a, b) in enumerate(zip(got, ref)) if not torch.equal(a, b)]
                        if bad:
                            failures.append(f"{config} round {r}: outputs {bad} differ from its own reference")
                            return
            except Exception as exc:  # reported by the test, not lost in the thread
                failures.append(f"{config}: {exc!r}")

        threads = [threading.Thread(target=worker, args=(c, ref)) for c, ref in zip(pair, refs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures


@pytest.fixture(scope="module")
def tiny_llama():
    from ds4tui.engine.loader import load_model

    return load_model("tiny-llama")

