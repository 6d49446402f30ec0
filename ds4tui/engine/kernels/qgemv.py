"""Build, load and call the C kernels; `QuantMatrix`, a weight kept as the file's GGUF blocks.

Owns: compiling the C sources on first use, the default instruction set variant and each
thread's own choice (the configuration word every call passes), the lock that serializes
kernel calls, and `QuantMatrix` (y = W x for one vector, Y = X W^T for
a few rows, W in any type of quants.py, possibly in row parts of different types).
Leaves to callers: which weights take this path (decode at batch 1 and products of up to
256 rows; longer prefill chunks use an fp32 torch GEMM). llama_step.py drives the fused
decode step through `library()`.

Variants (`backend()` names the calling thread's):
- "avx512", "avx2", "scalar": one library holds the kernels built three times (isa.c with
  AVX-512 F/BW/VL, with AVX2+FMA+F16C, and with no vector flags); the default is the widest
  one the CPU supports (`__builtin_cpu_supports`).
- "torch": no compiler or the build failed: dequantize once (gguf), then fp32 `mv`.
All compute the same numbers up to float summation order; `variants()` lists those this CPU
runs and `use_variant(name)` switches the calling thread for a block of code (tests compare
each to scalar). The choice is the calling thread's: every call passes its thread's
configuration word (`config()`: the variant and the bf16 choice) to the library, which keeps
no setting of its own, so a thread inside `use_variant` never changes what another runs.
One exception, on purpose: where the CPU has AVX512_BF16, the AVX-512 variant multiplies
products of 96 rows and more (prefill chunks), and Q4_1 products of 2 rows and more, with
weights and activations rounded to bf16, summed in fp32, at twice the fp32 FMA rate
(qgemm.c), and so does chunk attention over 512 keys or more (attn.c); decode (1 row) and
other types' short products stay fp32.
`DS4TUI_BF16=auto|on|off` chooses the default (`on` on a CPU without it: the torch backend,
with the reason), `bf16_products()` tells, `use_bf16(on)` switches the calling thread for a
block of code.

The library is built with the package (setup.py runs build.py: a wheel and an editable install
carry `libds4k.so` beside these sources) and loaded from there when its key, compiled into it,
matches the sources here. Without one (an install whose build had no compiler, or sources
edited since), it is compiled on first use (`prepare(progress)` reports it; objects in
parallel; docs/perf-archive.md, "Backends") into `data_dir()/kernels/<key>-<compiler>/`, written to a
temporary name and renamed, so concurrent first uses never load a half-written file; builds
of older sources are pruned after a day. A machine without either still runs (torch backend).
`DS4TUI_KERNELS=auto|avx512|avx2|scalar|torch` forces a variant (a forced one the CPU lacks
gives the torch backend, with the reason in `backend_reason()`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import torch

from ds4tui import paths
from ds4tui.engine.kernels import build, quants
from ds4tui.engine.kernels.quants import TYPE_IDS, dequantize, quantize, row_bytes  # noqa: F401 (re-exported)

ABI = 8  # must equal ds4k_abi() in dispatch.c
ISAS = build.ISAS  # index = the C side's ISA number

_DIR = Path(__file__).parent
PREBUILT = _DIR / build.LIB_NAME  # where the package build puts the library

_lock = threading.Lock()  # guards loading
# Serializes calls into the library: its thread pool runs one job at a time.
kernel_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_backend: str | None = None  # the process default: a variant of ISAS, or "torch"
_why: str = ""

# The configuration word every call passes first (ds4k.h's DS4K_CFG_*): the variant's index
# in the low byte, CFG_BF16 for bf16 long products. _default_cfg is chosen once at load
# (DS4TUI_KERNELS, DS4TUI_BF16); use_variant and use_bf16 override it for one thread.
CFG_ISA_MASK = 0xFF
CFG_BF16 = 0x100
_default_cfg = 0
_thread = threading.local()


class Mat(ctypes.Structure):
    """ds4k_mat: one matrix or one row part of a fused one."""

    _fields_ = [("w", ctypes.c_void_p), ("type", ctypes.c_int32), ("rows", ctypes.c_int32)]


# ---------------------------------------------------------------- building and loading


class _NoLibrary(Exception):
    """No library to load here; the message says why (the torch backend's reason)."""


def _find_library(progress: build.Progress | None) -> ctypes.CDLL:
    """The prebuilt library when it was built from these sources, else a build of them in the
    data dir (compiled now if needed, reporting through `progress`)."""
    key = build.source_key(_DIR)
    stale = ""
    if PREBUILT.is_file():
        try:
            lib = _load(PREBUILT)
            if source_key_of(lib) == key:
                return lib
            stale = "the installed kernels are of other sources, and "
        except (OSError, RuntimeError, AttributeError) as exc:
            stale = f"the installed kernels do not load ({exc}), and "
    cc = build.find_compiler()
    if cc is None:
        raise _NoLibrary(f"{stale}no C compiler (cc/gcc/clang) on PATH")
    version = hashlib.sha256(build.compiler_version(cc).encode()).hexdigest()[:8]
    out_dir = paths.data_dir() / "kernels" / f"{key}-{version}"
    lib_path = out_dir / build.LIB_NAME
    if not lib_path.is_file():
        try:
            build.compile_library(cc, lib_path, _DIR, progress)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            raise _NoLibrary(f"kernel build failed: {exc}") from None
        _prune_old_builds(out_dir)
    try:
        return _load(lib_path)
    except (OSError, RuntimeError, AttributeError) as exc:
        raise _NoLibrary(f"kernel library failed to load: {exc}") from None


def source_key_of(lib: ctypes.CDLL) -> str:
    """The build key compiled into a library ("" for one built before keys were)."""
    try:
        fn = lib.ds4k_source_key
    except AttributeError:
        return ""
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    return (fn() or b"").decode()


STALE_BUILD_S = 86400  # builds of other sources untouched this long are removed


def _prune_old_builds(keep: Path) -> None:
    """Remove builds of older sources (one per edit or upgrade) once they are a day old.
    A process that still has one loaded is unaffected: unlinking a mapped file is safe."""
    now = time.time()
    for d in keep.parent.iterdir():
        try:
            if d != keep and d.is_dir() and now - d.stat().st_mtime > STALE_BUILD_S:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


def _load(lib_path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_path))  # CDLL releases the GIL during calls
    for name in ("ds4k_abi", "ds4k_best_isa", "ds4k_cpu_bf16"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [], ctypes.c_int
    if lib.ds4k_abi() != ABI:
        raise RuntimeError(f"{lib_path}: ABI {lib.ds4k_abi()} != {ABI}")
    i32, i64, ptr, f32 = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    # (entry point, its arguments after the configuration word); every one returns int.
    for name, args in (
        ("ds4k_gemv", [ptr, i32, ptr, ptr, i64, i32]),
        ("ds4k_gemm", [ptr, i32, ptr, ptr, i64, i64, i32]),
        ("ds4k_dequant", [i32, ptr, ptr, i64, i64]),
        ("ds4k_attn", [ptr, i64, ptr, i64, ptr, ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, i32, i64, i64, i64, i64,
                       i32, i32, i32, f32, i32]),
        ("ds4k_glu", [ptr, i64, ptr, i64, i64, i32, i32]),
        ("ds4k_rms_norm", [ptr, i64, ptr, ptr, i64, i64, f32, i32]),
        ("ds4k_qk_rope", [ptr, i64, ptr, f32, ptr, ptr, ptr, i64, i64, i64, i32]),
        ("ds4k_all_finite", [ptr, i64, i32]),
    ):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [i32, *args], i32
    lib.ds4k_set_spin_ns.argtypes = [ctypes.c_long]
    lib.ds4k_set_spin_ns.restype = None
    lib.ds4k_reserve_threads.argtypes = [ctypes.c_int]
    lib.ds4k_reserve_threads.restype = None
    lib.ds4k_reserved_threads.argtypes = []
    lib.ds4k_reserved_threads.restype = ctypes.c_int
    return lib


def _init(progress: build.Progress | None = None) -> None:
    global _lib, _backend, _why, _default_cfg
    forced = os.environ.get("DS4TUI_KERNELS", "auto").strip().lower() or "auto"
    if forced not in ("auto", "torch", *ISAS):
        raise ValueError(f"DS4TUI_KERNELS={forced!r}: expected auto, {', '.join(reversed(ISAS))} or torch")
    if forced == "torch":
        _backend, _why = "torch", "forced by DS4TUI_KERNELS=torch"
        return
    try:
        lib = _find_library(progress)
    except _NoLibrary as exc:
        _backend, _why = "torch", str(exc)
        return
    best = lib.ds4k_best_isa()
    isa = best if forced == "auto" else ISAS.index(forced)
    if isa > best:
        _backend, _why = "torch", f"DS4TUI_KERNELS={forced}: this CPU runs only {', '.join(ISAS[: best + 1])}"
        return
    bf16 = os.environ.get("DS4TUI_BF16", "auto").strip().lower() or "auto"
    if bf16 not in ("auto", "on", "off"):
        raise ValueError(f"DS4TUI_BF16={bf16!r}: expected auto, on or off")
    if bf16 == "on" and not lib.ds4k_cpu_bf16():
        _backend, _why = "torch", "DS4TUI_BF16=on: this CPU (or compiler) has no AVX512_BF16"
        return
    use_bf16 = bf16 != "off" and bool(lib.ds4k_cpu_bf16())
    _default_cfg = isa | (CFG_BF16 if use_bf16 else 0)
    _lib, _backend = lib, ISAS[isa]
    _why = f"{_backend} kernels ({'forced by DS4TUI_KERNELS' if forced != 'auto' else 'the widest this CPU runs'})"


def _ensure(progress: build.Progress | None = None) -> None:
    if _backend is None:
        with _lock:
            if _backend is None:
                _init(progress)


def prepare(progress: build.Progress | None = None) -> str:
    """Load the library now, compiling it first where this install has none that matches its
    sources (progress(build.WHAT, fraction) meanwhile: about a minute on 2 cores); the backend."""
    _ensure(progress)
    assert _backend is not None
    return _backend


def loaded() -> bool:
    """Whether the backend is chosen already (so a call cannot start a build)."""
    return _backend is not None


def backend() -> str:
    """The calling thread's variant: "avx512", "avx2", "scalar" or "torch" (building the
    library if needed)."""
    _ensure()
    assert _backend is not None
    return _backend if _lib is None else ISAS[config() & CFG_ISA_MASK]


def config() -> int:
    """The configuration word this thread's kernel calls pass (the variant and the bf16
    choice): the process default, or that of the innermost use_variant / use_bf16 block."""
    return getattr(_thread, "cfg", _default_cfg)


@contextlib.contextmanager
def _thread_config(cfg: int) -> Iterator[None]:
    before = getattr(_thread, "cfg", None)
    _thread.cfg = cfg
    try:
        yield
    finally:
        if before is None:
            del _thread.cfg
        else:
            _thread.cfg = before


def backend_reason() -> str:
    """Why this backend: the variant chosen, or the errors that ruled the library out."""
    _ensure()
    return _why


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, or None on the torch backend."""
    _ensure()
    return _lib


def variants() -> list[str]:
    """The library variants this CPU runs, narrowest first ([] on the torch backend)."""
    lib = library()
    return [] if lib is None else list(ISAS[: lib.ds4k_best_isa() + 1])


def use_variant(name: str) -> contextlib.AbstractContextManager[None]:
    """Run this thread's kernel calls as variant `name` inside the block (tests: every variant
    vs scalar); other threads keep theirs, and threads started inside get the default."""
    lib = library()
    if lib is None or name not in variants():
        raise ValueError(f"variant {name!r} is not available here (have {variants()})")
    return _thread_config((config() & ~CFG_ISA_MASK) | ISAS.index(name))


def bf16_products() -> bool:
    """Whether this thread's products of 96 rows and more (and Q4_1 ones of 2 and more) run on
    the bf16 tiles: AVX512_BF16 on the CPU, the AVX-512 variant and bf16 chosen (DS4TUI_BF16
    not `off`, or use_bf16(True))."""
    return library() is not None and backend() == "avx512" and bool(config() & CFG_BF16)


def bf16_available() -> bool:
    """Whether this CPU runs the AVX-512 variant and has AVX512_BF16 (bf16 products possible)."""
    lib = library()
    return lib is not None and "avx512" in variants() and bool(lib.ds4k_cpu_bf16())


def use_bf16(on: bool) -> contextlib.AbstractContextManager[None]:
    """This thread's long products and deep attention in bf16 (True) or fp32 (False) inside
    the block (tests, A/B benches); bf16 takes effect with the AVX-512 variant only."""
    lib = library()
    if lib is None:
        if on:
            raise ValueError("the C kernels are not available (torch backend)")
        return contextlib.nullcontext()  # fp32 everywhere already
    if on and not lib.ds4k_cpu_bf16():
        raise ValueError("bf16 products need a CPU with AVX512_BF16")
    return _thread_config((config() | CFG_BF16) if on else (config() & ~CFG_BF16))


def reserve_threads(delta: int) -> None:
    """Another thread of this process starts (delta > 0) or ends (-delta) work that keeps
    `delta` cores busy: kernels run on that many fewer threads meanwhile (pool.c)."""
    _ensure()
    if _lib is not None:
        _lib.ds4k_reserve_threads(int(delta))


def reserved_threads() -> int:
    """Threads reserved by reserve_threads now (0 without the C library)."""
    _ensure()
    return 0 if _lib is None else _lib.ds4k_reserved_threads()


def all_finite(address: int, count: int, item_bytes: int) -> bool | None:
    """Whether the `count` f16 (item_bytes 2) or f32 (4) values at `address` hold no NaN or
    infinity (finite.c: one pass, on the calling thread, no kernel lock: a restore's reader
    calls it beside the forward's kernels); None without the C library, or before it is
    loaded: a save's check never waits for a build (load_model prepares the kernels)."""
    if _lib is None:
        return None
    ok = _lib.ds4k_all_finite(config(), address, count, item_bytes)
    if ok < 0:
        raise ValueError(f"all_finite: {item_bytes}-byte items")
    return bool(ok)


# os.cpu_count() reads /sys on every call (~60 us, 2% of a SmolLM2 token); the CPUs do not change.
_CPUS = os.cpu_count() or 1


def num_threads() -> int:
    return max(1, min(torch.get_num_threads(), _CPUS))


def dequantize_c(blocks: torch.Tensor, qtype: str, cols: int) -> torch.Tensor:
    """`quants.dequantize` computed by the active C variant (bit-identical; tests check it)."""
    lib = library()
    if lib is None:
        raise RuntimeError("the C kernels are not available (torch backend)")
    rb = row_bytes(qtype, cols)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != rb:
        raise ValueError(f"expected uint8 [rows, {rb}] blocks, got {blocks.dtype} {tuple(blocks.shape)}")
    blocks = blocks.contiguous()
    out = torch.empty(blocks.shape[0], cols, dtype=torch.float32)
    with kernel_lock:
        rc = lib.ds4k_dequant(config(), TYPE_IDS[qtype], blocks.data_ptr(), out.data_ptr(), blocks.shape[0], cols)
    if rc != 0:
        raise RuntimeError(f"ds4k_dequant rejected {qtype} [{blocks.shape[0]}, {cols}]")
    return out


# ---------------------------------------------------------------- the weight holder

Part = tuple[str, torch.Tensor]  # (type, uint8 blocks [rows, row_bytes])
MAX_PARTS = 3  # ds4k.h's DS4K_MAX_PARTS
GEMM_MAX_COLS = 8192  # qgemm.c's GEMM_MAX_COLS
GEMV_MAX_COLS = 65536  # qgemv.c's GEMV_MAX_COLS


def as_parts(entry: Part | Sequence[Part]) -> list[Part]:
    """A raw-weights entry, (type, blocks) or a list of them, as a list of parts."""
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str):
        return [entry]
    return list(entry)


class QuantMatrix:
    """A [rows, cols] weight kept as GGUF blocks: one or more row parts, each (type, uint8
    [rows_i, row_bytes], CPU), stacked by rows (a fused QKV whose V rows have another type).

    `matvec(x)` is y = W x and `matmul(X)` is X W^T, both equal to `dequantize() @ x` up to
    summation order. A block never spans two rows, so row slices are plain row operations.
    """

    __slots__ = ("parts", "rows", "cols", "_mats", "_dense")

    def __init__(self, blocks: torch.Tensor, qtype: str, cols: int) -> None:
        self._setup([(qtype, blocks)], cols)

    @classmethod
    def from_parts(cls, parts: Part | Sequence[Part], cols: int) -> "QuantMatrix":
        self = cls.__new__(cls)
        self._setup(as_parts(parts), cols)
        return self

    def _setup(self, parts: list[Part], cols: int) -> None:
        if not 1 <= len(parts) <= MAX_PARTS:
            raise ValueError(f"a QuantMatrix has 1..{MAX_PARTS} parts, got {len(parts)}")
        checked = []
        for qtype, blocks in parts:
            rb = row_bytes(qtype, cols)
            if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != rb:
                raise ValueError(f"expected uint8 [rows, {rb}] blocks for {qtype}, got {blocks.dtype} {tuple(blocks.shape)}")
            if blocks.device.type != "cpu":
                raise ValueError("QuantMatrix blocks must live on the CPU")
            checked.append((qtype, blocks.contiguous()))
        self.parts, self.cols = checked, cols
        self.rows = sum(b.shape[0] for _, b in checked)
        self._mats = (Mat * MAX_PARTS)(*(Mat(b.data_ptr(), TYPE_IDS[t], b.shape[0]) for t, b in checked))
        self._dense: torch.Tensor | None = None
        _ensure()

    @classmethod
    def cat(cls, parts: list["QuantMatrix"]) -> "QuantMatrix":
        """Rows of several matrices of one width, stacked (fused projections); parts of one
        type are merged into one."""
        cols = parts[0].cols
        if any(p.cols != cols for p in parts):
            raise ValueError("QuantMatrix.cat needs one row length")
        merged: list[Part] = []
        for qtype, blocks in (part for m in parts for part in m.parts):
            if merged and merged[-1][0] == qtype:
                merged[-1] = (qtype, torch.cat([merged[-1][1], blocks]))
            else:
                merged.append((qtype, blocks))
        return cls.from_parts(merged, cols)

    @property
    def qtype(self) -> str:
        """The type, or "mixed" when the parts differ."""
        types = {t for t, _ in self.parts}
        return types.pop() if len(types) == 1 else "mixed"

    @property
    def blocks(self) -> torch.Tensor:
        if len(self.parts) != 1:
            raise ValueError("a multi-part QuantMatrix has no single block tensor")
        return self.parts[0][1]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for _, b in self.parts)

    def dequantize(self) -> torch.Tensor:
        return torch.cat([dequantize(b, t, self.cols) for t, b in self.parts])

    def _fallback(self) -> torch.Tensor:
        if self._dense is None:
            self._dense = self.dequantize()  # torch backend: pay fp32 memory once
        return self._dense

    def matvec(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """y [rows] = W x for x fp32 with cols elements (any shape, contiguous)."""
        if x.dtype != torch.float32 or x.numel() != self.cols or not x.is_contiguous() or x.device.type != "cpu":
            raise ValueError(f"x must be a contiguous CPU float32 tensor of {self.cols} elements")
        if out is None:
            out = torch.empty(self.rows, dtype=torch.float32)
        elif out.dtype != torch.float32 or out.numel() != self.rows or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous float32 tensor of {self.rows} elements")
        if _lib is None or self.cols > GEMV_MAX_COLS:
            torch.mv(self._fallback(), x.view(-1), out=out.view(-1))
            return out
        with kernel_lock:
            rc = _lib.ds4k_gemv(config(), self._mats, len(self.parts), x.data_ptr(), out.data_ptr(), self.cols, num_threads())
        if rc != 0:
            raise RuntimeError(f"ds4k_gemv rejected a {self.qtype} [{self.rows}, {self.cols}] product")
        return out

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, cols] float32 -> [n, rows] float32 (qgemm.c: meant for n up to a few hundred)."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.cols:
            raise ValueError(f"x must be float32 [n, {self.cols}], got {x.dtype} {tuple(x.shape)}")
        x = x.contiguous()
        if _lib is None or self.cols > GEMM_MAX_COLS or self.cols % 8 or x.shape[0] == 0:
            return x @ self._fallback().T
        y = torch.empty((x.shape[0], self.rows), dtype=torch.float32)
        with kernel_lock:
            rc = _lib.ds4k_gemm(config(), self._mats, len(self.parts), x.data_ptr(), y.data_ptr(), self.cols,
                                x.shape[0], num_threads())
        if rc != 0:
            raise RuntimeError(f"ds4k_gemm rejected a {self.qtype} [{self.rows}, {self.cols}] product")
        return y

    def fill_mats(self, dest) -> None:
        """Copy this matrix's parts into a ctypes array of DS4K_MAX_PARTS Mat (the step's table)."""
        for i in range(MAX_PARTS):
            dest[i] = self._mats[i]


__all__ = ["QuantMatrix", "Mat", "backend", "backend_reason", "config", "library", "variants", "use_variant", "quants",
           "dequantize", "dequantize_c", "quantize", "row_bytes", "TYPE_IDS", "kernel_lock", "num_threads"]
