"""Fixtures of the engine tests: the C kernel library, found or built once per session, and
the kernel variants this CPU runs.

Nothing here touches the library while pytest collects: a build that fails is reported by
each test that needs the kernels (with the compiler's error), not hidden as a skip.
"""

from __future__ import annotations

import pytest

from ds4tui.engine.kernels import qgemv


@pytest.fixture(scope="session")
def kernels():
    """The loaded kernel library (built now if this install has none)."""
    lib = qgemv.library()
    if lib is None:
        reason = qgemv.backend_reason()
        if "DS4TUI_KERNELS" in reason:
            pytest.skip(f"the C kernels are switched off: {reason}")
        pytest.fail(f"the C kernels are not available: {reason}", pytrace=False)
    return lib


@pytest.fixture(params=qgemv.ISAS)
def variant(request, kernels) -> str:
    """Each kernel variant in turn; those this CPU cannot run are skipped, saying so."""
    if request.param not in qgemv.variants():
        pytest.skip(f"this CPU does not run the {request.param} kernels (it runs {', '.join(qgemv.variants())})")
    return request.param


@pytest.fixture
def avx512_cpu(kernels) -> None:
    if "avx512" not in qgemv.variants():
        pytest.skip("needs a CPU with AVX-512")


@pytest.fixture
def bf16_cpu(kernels) -> None:
    if not qgemv.bf16_available():
        pytest.skip("needs a CPU with AVX-512 and AVX512_BF16")
