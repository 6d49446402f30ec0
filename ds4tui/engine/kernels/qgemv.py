"""Quantized batch-1 GEMV over GGUF blocks: build, load and call the C kernels, with a torch fallback.

Owns: the Q4_1 / Q8_0 block formats on the torch side (`dequantize`, the reference
semantics), compiling the C sources (qgemv.c, pool.c, llama_step.c, qgemm.c) on first use,
choosing a backend, the lock that serializes kernel calls, and `QuantMatrix`, a weight
kept as the file's raw blocks whose `matvec` computes y = W x for one fp32 vector.
Leaves to callers: which weights take this path (decode at batch 1; prefill chunks of up to
256 rows use qgemm.py, longer ones an fp32 torch GEMM) and keeping the fp32 copy they need for prefill. llama_step.py drives the
fused decode step through `library()`.

Backends, best first (`backend()` names the active one):
- "avx2": the sources built with -mavx2 -mfma -mf16c; chosen only when /proc/cpuinfo
  lists avx2, fma and f16c.
- "scalar": the same source built without vector flags (any CPU with a C compiler).
- "torch": no compiler or the build failed: dequantize once, then fp32 `mv`.
All three compute the same numbers up to float summation order.

The library is compiled with the system C compiler (`$CC`, else `cc`) on first use
(docs/perf.md, "Backends") into `data_dir()/kernels/<hash of sources, flags, compiler>-<variant>/`, written to a
temporary name and renamed, so concurrent first uses never load a half-written file; builds
of older sources are pruned after a day. First use rather than `pip install`: the CPU check
happens on the machine that runs it, editable installs need no build step, and a machine
without a compiler still runs (torch backend). `DS4TUI_KERNELS=torch`
(or `scalar`, `avx2`) forces a backend, for tests and benchmarks.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

from ds4tui import paths

QK = 32  # weights per block, both formats
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # f16 d [+ f16 m] + payload
# Type ids as in GGML (and ds4k.h): a GGUF tensor's type maps through unchanged.
TYPE_IDS = {"f32": 0, "f16": 1, "q4_1": 3, "q8_0": 8}
ABI = 2  # must equal ds4k_abi() in qgemv.c

_DIR = Path(__file__).parent
_SOURCES = [_DIR / "qgemv.c", _DIR / "pool.c", _DIR / "llama_step.c", _DIR / "qgemm.c"]
_HEADERS = [_DIR / "ds4k.h"]
_VARIANT_FLAGS = {
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "scalar": [],
}
_COMMON_FLAGS = ["-O3", "-std=c11", "-fPIC", "-shared", "-D_GNU_SOURCE"]

_lock = threading.Lock()  # guards loading
# Serializes calls into the library: its thread pool runs one job at a time.
kernel_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_backend: str | None = None
_why: str = ""


# ---------------------------------------------------------------- formats (reference semantics)


def row_bytes(qtype: str, cols: int) -> int:
    if qtype == "f32" or qtype == "f16":
        if cols <= 0:
            raise ValueError(f"row length {cols} is not positive")
        return cols * (4 if qtype == "f32" else 2)
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"unsupported weight type {qtype!r} (have {sorted(TYPE_IDS)})")
    if cols <= 0 or cols % QK:
        raise ValueError(f"row length {cols} is not a positive multiple of {QK}")
    return cols // QK * BLOCK_BYTES[qtype]


def dequantize(blocks: torch.Tensor, qtype: str, cols: int) -> torch.Tensor:
    """fp32 [rows, cols] from raw blocks uint8 [rows, row_bytes]: the values GGUF defines."""
    rb = row_bytes(qtype, cols)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != rb:
        raise ValueError(f"expected uint8 [rows, {rb}] blocks, got {blocks.dtype} {tuple(blocks.shape)}")
    rows = blocks.shape[0]
    if qtype in ("f32", "f16"):
        return blocks.view(torch.float32 if qtype == "f32" else torch.float16).float()
    nb = cols // QK
    b = blocks.reshape(rows, nb, BLOCK_BYTES[qtype])  # [rows, nb, block]
    d = b[..., 0:2].contiguous().view(torch.float16).float()  # [rows, nb, 1]
    if qtype == "q4_1":
        m = b[..., 2:4].contiguous().view(torch.float16).float()
        qs = b[..., 4:]  # [rows, nb, 16]: low nibbles are weights 0..15, high ones 16..31
        q = torch.cat([qs & 15, qs >> 4], dim=-1).float()  # [rows, nb, 32]
        w = d * q + m
    else:
        q = b[..., 2:].contiguous().view(torch.int8).float()  # [rows, nb, 32]
        w = q * d
    return w.reshape(rows, cols)


def quantize(w: torch.Tensor, qtype: str) -> torch.Tensor:
    """Blocks uint8 [rows, row_bytes] for fp32 w [rows, cols], rounding like ggml's reference
    quantizers (for tests and tiny models: real weights keep the file's own blocks)."""
    rows, cols = w.shape
    rb = row_bytes(qtype, cols)
    if qtype in ("f32", "f16"):
        return w.to(torch.float32 if qtype == "f32" else torch.float16).contiguous().view(torch.uint8).reshape(rows, rb)
    x = w.float().reshape(rows, cols // QK, QK)  # [rows, nb, 32]
    if qtype == "q8_0":
        d = x.abs().amax(-1, keepdim=True) / 127.0
        q = torch.where(d > 0, x / d, torch.zeros_like(x)).round().clamp(-128, 127).to(torch.int8)
        parts = [d.half().view(torch.uint8), q.view(torch.uint8)]
    else:
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        d = (hi - lo) / 15.0
        q = torch.where(d > 0, (x - lo) / d, torch.zeros_like(x)).round().clamp(0, 15).to(torch.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)  # low nibbles: weights 0..15
        parts = [d.half().view(torch.uint8), lo.half().view(torch.uint8), packed]
    return torch.cat(parts, dim=-1).reshape(rows, rb)


# ---------------------------------------------------------------- building and loading


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def _build(variant: str, cc: str) -> Path:
    """Compile the kernels for `variant` unless a build of these exact sources/flags/compiler exists."""
    flags = _COMMON_FLAGS + _VARIANT_FLAGS[variant]
    src = b"".join(p.read_bytes() for p in _SOURCES + _HEADERS)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(src + repr((flags, cc, version)).encode()).hexdigest()[:16]
    out_dir = paths.data_dir() / "kernels" / f"{key}-{variant}"
    lib = out_dir / "libds4k.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *flags, f"-I{_DIR}", "-o", tmp, *map(str, _SOURCES), "-lpthread", "-lm"],
            capture_output=True, text=True, timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-400:]}")
        os.replace(tmp, lib)  # atomic: a concurrent builder's identical file is fine too
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _prune_old_builds(out_dir)
    return lib


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


def _load(lib_path: Path, variant: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_path))  # CDLL releases the GIL during calls
    lib.ds4k_abi.restype = ctypes.c_int
    lib.ds4k_isa.restype = ctypes.c_int
    if lib.ds4k_abi() != ABI:
        raise RuntimeError(f"{lib_path}: ABI {lib.ds4k_abi()} != {ABI}")
    if lib.ds4k_isa() != (1 if variant == "avx2" else 0):
        raise RuntimeError(f"{lib_path}: built without the {variant} paths")
    lib.ds4k_gemv_typed.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.ds4k_gemv_typed.restype = ctypes.c_int
    lib.ds4k_set_spin_ns.argtypes = [ctypes.c_long]
    lib.ds4k_set_spin_ns.restype = None
    return lib


def _init() -> None:
    global _lib, _backend, _why
    forced = os.environ.get("DS4TUI_KERNELS", "auto").strip().lower() or "auto"
    if forced not in ("auto", "avx2", "scalar", "torch"):
        raise ValueError(f"DS4TUI_KERNELS={forced!r}: expected auto, avx2, scalar or torch")
    if forced == "torch":
        _backend, _why = "torch", "forced by DS4TUI_KERNELS=torch"
        return
    cc = _compiler()
    if cc is None:
        _backend, _why = "torch", "no C compiler (cc/gcc/clang) on PATH"
        return
    flags = _cpu_flags()
    variants = [forced] if forced != "auto" else (["avx2", "scalar"] if {"avx2", "fma", "f16c"} <= flags else ["scalar"])
    errors = []
    for variant in variants:
        if variant == "avx2" and not {"avx2", "fma", "f16c"} <= flags:
            errors.append("avx2: CPU lacks avx2/fma/f16c")
            continue
        try:
            _lib, _backend = _load(_build(variant, cc), variant), variant
            _why = f"{variant} build of the ds4k kernels"
            return
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            errors.append(f"{variant}: {exc}")
    _backend, _why = "torch", "; ".join(errors)


def _ensure() -> None:
    if _backend is None:
        with _lock:
            if _backend is None:
                _init()


def backend() -> str:
    """The active backend: "avx2", "scalar" or "torch" (building the library if needed)."""
    _ensure()
    assert _backend is not None
    return _backend


def backend_reason() -> str:
    """Why this backend: the build used, or the errors that ruled the others out."""
    _ensure()
    return _why


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, or None on the torch backend."""
    _ensure()
    return _lib


def set_spin_us(us: int) -> None:
    """How long idle kernel threads spin before sleeping (default 300 us)."""
    _ensure()
    if _lib is not None:
        _lib.ds4k_set_spin_ns(int(us) * 1000)


def num_threads() -> int:
    return max(1, min(torch.get_num_threads(), os.cpu_count() or 1))


# ---------------------------------------------------------------- the weight holder


class QuantMatrix:
    """A [rows, cols] weight kept as GGUF blocks (uint8 [rows, row_bytes], CPU, contiguous).

    `matvec(x, out)` is y = W x for one fp32 vector, exact to `dequantize(blocks) @ x` up to
    summation order. Row slices of the blocks (fused QKV, permuted RoPE rows) are plain
    row operations on `blocks`, since a block never spans two rows.
    """

    __slots__ = ("blocks", "qtype", "rows", "cols", "_type_id", "_ptr", "_dense")

    def __init__(self, blocks: torch.Tensor, qtype: str, cols: int) -> None:
        rb = row_bytes(qtype, cols)
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != rb:
            raise ValueError(f"expected uint8 [rows, {rb}] blocks for {qtype}, got {blocks.dtype} {tuple(blocks.shape)}")
        if blocks.device.type != "cpu":
            raise ValueError("QuantMatrix blocks must live on the CPU")
        self.blocks = blocks.contiguous()
        self.qtype, self.rows, self.cols = qtype, blocks.shape[0], cols
        _ensure()
        self._type_id = TYPE_IDS[qtype]
        self._ptr = self.blocks.data_ptr()
        self._dense: torch.Tensor | None = None

    @classmethod
    def cat(cls, parts: list["QuantMatrix"]) -> "QuantMatrix":
        """Rows of several matrices of the same type and width, stacked (fused projections)."""
        qtype, cols = parts[0].qtype, parts[0].cols
        if any(p.qtype != qtype or p.cols != cols for p in parts):
            raise ValueError("QuantMatrix.cat needs one quant type and one row length")
        return cls(torch.cat([p.blocks for p in parts], dim=0), qtype, cols)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def dequantize(self) -> torch.Tensor:
        return dequantize(self.blocks, self.qtype, self.cols)

    def matvec(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """y [rows] = W x for x fp32 with cols elements (any shape, contiguous)."""
        if x.dtype != torch.float32 or x.numel() != self.cols or not x.is_contiguous() or x.device.type != "cpu":
            raise ValueError(f"x must be a contiguous CPU float32 tensor of {self.cols} elements")
        if out is None:
            out = torch.empty(self.rows, dtype=torch.float32)
        elif out.dtype != torch.float32 or out.numel() != self.rows or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous float32 tensor of {self.rows} elements")
        if _lib is None:
            if self._dense is None:
                self._dense = self.dequantize()  # fallback: pay fp32 memory once
            torch.mv(self._dense, x.view(-1), out=out.view(-1))
            return out
        with kernel_lock:
            rc = _lib.ds4k_gemv_typed(self._type_id, self._ptr, x.data_ptr(), out.data_ptr(),
                                      self.rows, self.cols, num_threads())
        if rc != 0:
            raise RuntimeError(f"ds4k_gemv_typed rejected a {self.qtype} [{self.rows}, {self.cols}] call")
        return out
