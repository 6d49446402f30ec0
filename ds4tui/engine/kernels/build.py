"""Compiling the C kernels into one shared library, libds4k.so: the sources, each variant's flags, the key.

Owns: what is compiled and how (pool.c, dispatch.c and isa.c once per instruction set variant,
objects in parallel, linked into one library written under a temporary name and renamed), and
the build key: a hash of the sources and flags, never of the checkout's path or the compiler,
compiled into the library (`ds4k_source_key()`) so that a loaded library tells which sources it
was built from. The package build runs this (setup.py: a wheel and an editable install carry
the library, and run with no compiler present); qgemv.py runs it only as the fallback for an
install without a matching library (then into the user data dir, with progress).

Standard library only: setup.py loads this file by path, before ds4tui (or torch) imports.
`python -m ds4tui.engine.kernels.build [OUT]` builds it by hand (default: beside the sources).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

LIB_NAME = "libds4k.so"
SRC_DIR = Path(__file__).parent
ISAS = ("scalar", "avx2", "avx512")  # index = the C side's ISA number (DS4K_ISA)
ISA_FLAGS = {
    "scalar": [],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl"],
}
# -ffp-contract=off: dequant.c must round each product and sum on its own, like numpy.
COMMON_FLAGS = ["-O3", "-std=c11", "-fPIC", "-D_GNU_SOURCE", "-ffp-contract=off"]
LINK_LIBS = ["-lpthread", "-lm"]
TIMEOUT_S = 600  # per compiler call: a stuck compiler is an error, a busy machine is not

Progress = Callable[[str, float], None]
WHAT = "C kernels"  # what a build's progress(what, fraction) names


def find_compiler() -> str | None:
    """The C compiler: `$CC`, else cc, gcc or clang on PATH."""
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def isas(machine: str | None = None) -> tuple[str, ...]:
    """The variants to build: the vector ones only for x86-64 (dispatch.c knows the same)."""
    machine = (machine or platform.machine()).lower()
    return ISAS if machine in ("x86_64", "amd64") else ISAS[:1]


def _variant_flags(n: int, isa: str) -> list[str]:
    return [f"-DDS4K_ISA={n}", f"-DDS4K_OPS_NAME=ds4k_ops_{isa}", *ISA_FLAGS[isa]]


def source_key(src_dir: Path = SRC_DIR) -> str:
    """16 hex digits naming these sources built with these flags, wherever they are."""
    h = hashlib.sha256()
    # Every C file here, listed or not: isa.c includes the kernels' .c files.
    for path in sorted(p for p in src_dir.iterdir() if p.suffix in (".c", ".h")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    flags = [COMMON_FLAGS, LINK_LIBS, [_variant_flags(n, isa) for n, isa in enumerate(isas())]]
    h.update(repr(flags).encode())
    return h.hexdigest()[:16]


def objects(cc: str, src_dir: Path = SRC_DIR, key: str = "") -> list[tuple[list[str], str]]:
    """(compile command without -o, object name) for each object of the library."""
    base = [cc, *COMMON_FLAGS, f"-I{src_dir}", "-c"]
    keyed = [f'-DDS4K_SOURCE_KEY="{key}"'] if key else []
    objs = [([*base, str(src_dir / "pool.c")], "pool.o"),
            ([*base, *keyed, str(src_dir / "dispatch.c")], "dispatch.o")]
    for n, isa in enumerate(isas()):
        objs.append(([*base, *_variant_flags(n, isa), str(src_dir / "isa.c")], f"isa_{isa}.o"))
    return objs


def compile_library(cc: str, out: Path, src_dir: Path = SRC_DIR, progress: Progress | None = None) -> str:
    """Build the library from `src_dir` into `out` (atomically: a concurrent builder's identical
    file is fine too); returns its key. progress(WHAT, fraction) after each step.
    Raises RuntimeError with the compiler's last words when a step fails."""
    key = source_key(src_dir)
    objs = objects(cc, src_dir, key)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    steps = len(objs) + 1
    try:
        if progress:
            progress(WHAT, 0.0)
        procs = [(subprocess.Popen([*cmd, "-o", str(work / name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True), name) for cmd, name in objs]
        errors = []
        for done, (proc, name) in enumerate(procs, 1):
            try:
                _, err = proc.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                err = f"no result after {TIMEOUT_S} s"
            if proc.returncode != 0:
                errors.append(f"{name}: {err.strip()[-400:]}")
            if progress:
                progress(WHAT, done / steps)
        if errors:
            raise RuntimeError(f"{cc} failed: {'; '.join(errors)}")
        tmp = work / LIB_NAME
        link = subprocess.run([cc, "-shared", "-o", str(tmp), *(str(work / n) for _, n in objs), *LINK_LIBS],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        if link.returncode != 0:
            raise RuntimeError(f"{cc} failed to link: {link.stderr.strip()[-400:]}")
        os.replace(tmp, out)
        if progress:
            progress(WHAT, 1.0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return key


def compiler_version(cc: str) -> str:
    """`cc --version`'s text: a fallback build of the same sources by another compiler is another build."""
    return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else SRC_DIR / LIB_NAME
    cc = find_compiler()
    if cc is None:
        print("no C compiler (cc/gcc/clang) on PATH", file=sys.stderr)
        return 1

    def show(what: str, fraction: float) -> None:
        print(f"\rcompiling the {what} (once) {fraction:4.0%}", end="", file=sys.stderr, flush=True)

    try:
        key = compile_library(cc, out, progress=show)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"\n{exc}", file=sys.stderr)
        return 1
    print(f"\n{out} ({key})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
