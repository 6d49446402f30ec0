"""The payload's NaN/infinity check (engine/payload.py all_finite) against numpy's isfinite."""

from __future__ import annotations

import numpy as np
import pytest

from ds4tui.engine.kernels import qgemv
from ds4tui.engine.payload import all_finite


def test_every_f16_bit_pattern_among_finite_values():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.isfinite(every)
    assert 0 < finite.sum() < len(every)  # both kinds are present
    base = np.linspace(-65504, 65504, 63).astype(np.float16)  # the extremes of f16 included
    assert all_finite(base)
    row = base.copy()
    for value, ok in zip(every, finite):
        row[31] = value
        assert all_finite(row) == ok, hex(int(np.array(value).view(np.uint16)))


@pytest.mark.parametrize("dtype, bits", [(np.float32, np.uint32), (np.float64, np.uint64)])
def test_f32_and_f64_specials(dtype, bits):
    info = np.finfo(dtype)
    finite = [0.0, -0.0, info.max, -info.max, info.tiny, -info.tiny, info.smallest_subnormal, -info.smallest_subnormal]
    exponent = int(np.array(np.inf, dtype).view(bits))  # all-ones exponent, zero mantissa
    sign = 1 << (8 * np.dtype(bits).itemsize - 1)
    nans = [np.array(v, dtype=bits).view(dtype) for v in (exponent | 1, exponent | (1 << info.nmant) - 1, sign | exponent | 5)]
    assert not any(np.isfinite(nans))
    base = np.random.default_rng(0).standard_normal(1000).astype(dtype)
    for v in finite + [np.inf, -np.inf, np.nan, -np.nan] + nans:
        row = base.copy()
        row[500] = v
        assert all_finite(row) == bool(np.isfinite(row).all()), v
    assert all_finite(np.empty(0, dtype))


def test_strided_views_are_checked_in_place():
    a = np.zeros((8, 6), np.float16)
    view = a[:, ::2]
    assert all_finite(view)
    a[3, 2] = -np.inf  # inside the view
    a[4, 1] = np.nan  # outside it
    assert not all_finite(view) and all_finite(a[:, 1::2][:4])


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_c_check_in_every_variant_finds_every_position(variant, dtype):
    """kernels/finite.c (contiguous f16/f32 runs: a restore's K/V) in each vector width: a NaN
    or infinity in the vector body or in the tail, of either sign, is found; the largest
    finite values and subnormals are not flagged."""
    info = np.finfo(dtype)
    base = np.random.default_rng(1).standard_normal(77).astype(dtype)
    base[[0, 40, 76]] = [info.max, -info.max, info.smallest_subnormal]
    with qgemv.use_variant(variant):
        assert qgemv.all_finite(base.ctypes.data, base.size, base.itemsize) is True
        for i in range(base.size):
            for bad in (np.inf, -np.inf, np.nan):
                row = base.copy()
                row[i] = bad
                assert qgemv.all_finite(row.ctypes.data, row.size, row.itemsize) is False, (i, bad)
                assert not all_finite(row)
