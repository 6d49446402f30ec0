"""qdot.c against ds4's own CPU functions, compiled from ds4.c: the same Q8_K and Q8 activation
bytes and the same dot products, bit for bit (ds4's scalar formulas compiled as written, without
its -ffast-math), and within a few float roundings of ds4 built with its Makefile's flags
(-O3 -ffast-math -march=native: the Q8_K scale d then differs in its last bit, and the float
steps may fuse).

Runs when DS4TUI_DS4_SRC names a checkout of antirez/ds4 (a directory holding ds4.c and
ds4.h) and a C compiler is on PATH; skipped with the reason otherwise. The harness includes
ds4.c into one translation unit (its functions are static) and wraps four of them."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from ds4tui.engine.dsv4.slice_blocks import random_rows
from ds4tui.engine.kernels import qdot, qgemv
from ds4tui.engine.kernels.qgemv import QuantMatrix

SRC = os.environ.get("DS4TUI_DS4_SRC", "")
pytestmark = [
    pytest.mark.skipif(not SRC or not (Path(SRC) / "ds4.c").is_file(),
                       reason="DS4TUI_DS4_SRC does not name an antirez/ds4 checkout (ds4.c)"),
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler"),
    pytest.mark.skipif(qgemv.library() is None, reason="no C kernels"),
]

HARNESS = r"""
#include "ds4.c"
void h_q8k(const float *x, void *y, int64_t k) { ds4_quantize_row_q8_K(x, (block_q8_K *)y, k); }
float h_dot_q2k(int n, const void *w, const void *y) {
    float s; ds4_vec_dot_q2_K_q8_K(n, &s, (const block_q2_K *)w, (const block_q8_K *)y); return s;
}
float h_dot_iq2(int n, const void *w, const void *y) {
    pthread_once(&iq2xxs_signed_grid_once, iq2xxs_signed_grid_init);
    float s; ds4_vec_dot_iq2_xxs_q8_K(n, &s, (const block_iq2_xxs *)w, (const block_q8_K *)y); return s;
}
void h_q8a(const float *x, int8_t *xq, float *scale, uint64_t n) { quantize_q8_0_activation(x, xq, scale, n); }
float h_dot_q8_0(const uint8_t *row, const int8_t *xq, const float *xs, uint64_t n) {
    return dot_q8_0_row(row, xq, xs, n, n / 32);
}
"""


def _build(tmp: Path, flags: list[str]) -> ctypes.CDLL:
    src = tmp / "harness.c"
    src.write_text(HARNESS)
    out = tmp / f"harness{abs(hash(tuple(flags)))}.so"
    cmd = ["cc", "-shared", "-fPIC", "-std=gnu11", "-D_GNU_SOURCE", "-DDS4_NO_GPU", f"-I{SRC}", *flags, "-w",
           str(src), "-o", str(out), "-lm", "-pthread"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"ds4 harness did not build: {r.stderr[-600:]}")
    lib = ctypes.CDLL(str(out))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.h_q8k.argtypes, lib.h_q8k.restype = [p, p, i64], None
    for name in ("h_dot_q2k", "h_dot_iq2"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [ctypes.c_int, p, p], ctypes.c_float
    lib.h_q8a.argtypes, lib.h_q8a.restype = [p, p, p, ctypes.c_uint64], None
    lib.h_dot_q8_0.argtypes, lib.h_dot_q8_0.restype = [p, p, p, ctypes.c_uint64], ctypes.c_float
    return lib


@pytest.fixture(scope="module")
def ds4(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds4harness")
    return {"as written": _build(tmp, ["-O2", "-ffp-contract=off"]),
            "makefile": _build(tmp, ["-O3", "-ffast-math", "-fno-finite-math-only", "-march=native"])}


def _x(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    x[3 * 256:4 * 256] = 0.0
    return x


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


@pytest.mark.parametrize("qtype", ["q2_k", "iq2_xxs", "q8_0"])
def test_activations_and_dots_equal_ds4s(ds4, qtype):
    cols, rows = 2048, 48
    rng = np.random.default_rng(7)
    if qtype == "q8_0":
        w = random_rows(rng, "Q8_0", rows, cols, ("normal", 0.0, cols ** -0.5))
    else:
        w = random_rows(rng, qtype.upper(), rows, cols, ("rms", cols ** -0.5))
    w = np.ascontiguousarray(w)
    ours = {}
    for name in qgemv.variants():
        with qgemv.use_variant(name):
            ours[name] = [qdot.matmul_q8(QuantMatrix(torch.from_numpy(w), qtype, cols), torch.from_numpy(_x(cols, s)))
                          for s in range(4)]
    for build, lib in ds4.items():
        for s in range(4):
            x = _x(cols, s)
            if qtype == "q8_0":
                xq, xs = np.zeros(cols, np.int8), np.zeros(cols // 32, np.float32)
                lib.h_q8a(_ptr(x), _ptr(xq), _ptr(xs), cols)
                raw = np.frombuffer(qdot.quantize(torch.from_numpy(x), qdot.Q8A), dtype=np.dtype([("d", "<f4"), ("qs", "i1", 32)]))
                if build == "as written":
                    assert (raw["d"] == xs).all() and (raw["qs"].reshape(-1) == xq).all()
                else:  # -ffast-math: d = max / 127 and 1 / d a last bit away, a q may round the other way
                    assert np.allclose(raw["d"], xs, rtol=2.0**-22, atol=0)
                    assert np.abs(raw["qs"].reshape(-1).astype(int) - xq).max() <= 1
                ref = np.array([lib.h_dot_q8_0(_ptr(w[r]), _ptr(xq), _ptr(xs), cols) for r in range(rows)], np.float32)
            else:
                yq = np.zeros(cols // 256 * 292, np.uint8)
                lib.h_q8k(_ptr(x), _ptr(yq), cols)
                mine = qdot.quantize(torch.from_numpy(x), qdot.Q8K)
                if build == "as written":
                    assert yq.tobytes() == mine
                else:  # -ffast-math turns d = 1 / iscale into something a last bit away
                    q8k = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
                    a, b = np.frombuffer(yq.tobytes(), q8k), np.frombuffer(mine, q8k)
                    assert (a["qs"] == b["qs"]).all() and (a["bsums"] == b["bsums"]).all()
                    assert np.allclose(a["d"], b["d"], rtol=2.0**-22, atol=0)
                fn = lib.h_dot_q2k if qtype == "q2_k" else lib.h_dot_iq2
                ref = np.array([fn(cols, _ptr(w[r]), _ptr(yq)) for r in range(rows)], np.float32)
            for name, ys in ours.items():
                got = ys[s].numpy()
                if build == "as written":
                    assert np.array_equal(got, ref), (qtype, name, s, np.abs(got - ref).max())
                else:  # ds4's -ffast-math -march=native may fuse and reorder the float steps
                    scale = np.abs(ref).max()
                    assert np.abs(got - ref).max() <= 1e-4 * scale, (qtype, name, s)
