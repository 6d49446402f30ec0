"""The package build's one extra step: the C kernels, compiled into the package.

pyproject.toml holds the metadata; this file only adds the kernel library as an extension
that ds4tui/engine/kernels/build.py compiles (each instruction set variant with its own
flags, which setuptools' per-extension flags cannot say). A wheel then carries
`ds4tui/engine/kernels/libds4k.so` and runs the C kernels with no compiler present; an
editable install (`make install`) builds it beside the sources. The extension is optional:
without a compiler the install still succeeds, and the kernels are compiled on first use
(or the torch backend runs).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1 (pyproject's build-system)

KERNELS = Path(__file__).resolve().parent / "ds4tui" / "engine" / "kernels"
LIB = "ds4tui.engine.kernels.libds4k"


def _kernel_build():
    """build.py, loaded by path: ds4tui's package imports torch, which a build need not have."""
    spec = importlib.util.spec_from_file_location("_ds4tui_kernel_build", KERNELS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildKernels(build_ext):
    """build_ext for the kernel library: a plain shared library loaded with ctypes, so no
    Python ABI tag in its name."""

    def get_ext_filename(self, fullname: str) -> str:
        # Asked with the full name (the path under build_lib) and the last part alone.
        if fullname in (LIB, LIB.rpartition(".")[2]):
            return os.path.join(*fullname.split(".")[:-1], _kernel_build().LIB_NAME)
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        if ext.name != LIB:
            return super().build_extension(ext)
        build = _kernel_build()
        out = Path(self.get_ext_fullpath(ext.name))
        cc = build.find_compiler()
        if cc is None:
            raise CompileError("no C compiler (cc/gcc/clang) on PATH: the kernels will be compiled on first use")
        shown = [-1]

        def progress(what: str, fraction: float) -> None:
            percent = int(fraction * 100)
            if percent != shown[0]:
                shown[0] = percent
                print(f"compiling the {what} (once) {percent:3d}%", file=sys.stderr, flush=True)

        try:
            key = build.compile_library(cc, out, KERNELS, progress)
        except RuntimeError as exc:
            raise CompileError(str(exc)) from None
        print(f"built {out} ({key})", file=sys.stderr)


class PlatformWheel(bdist_wheel):
    """The wheel holds a native library but no Python extension: any Python 3, this platform."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    ext_modules=[Extension(LIB, sources=[str(p.relative_to(KERNELS.parents[2])) for p in sorted(KERNELS.glob("*.c"))],
                           optional=True)],
    cmdclass={"build_ext": BuildKernels, "bdist_wheel": PlatformWheel},
)
