"""Side-by-side speed of ds4tui's llama engine and llama.cpp on the same GGUF.

Usage (from the repo root, after `make install` and `ds4tui models pull smollm2-135m-instruct`):

    .venv/bin/python bench/llama_cpp_compare.py --llama-bench /tmp/lcpp/build/bin/llama-bench

It runs, in alternation, `--rounds` times (medians reported; the machine may be shared):
  llama.cpp: llama-bench -m GGUF -p 512 -n 64 -t T -r 1 -o json        (pp512, tg64 at depth 0)
             llama-bench -m GGUF -p 0 -n 64 -d 4096 -t T -r 1 -o json  (tg64 at depth 4096)
  ds4tui:    ds4tui bench engine --model M --prompt-tokens 512 --decode-tokens 0 --repeats 1
             ds4tui bench engine --model M --prompt-tokens 1 --decode-tokens 64 --repeats 1
             ds4tui bench engine --model M --prompt-tokens 4096 --decode-tokens 64 --repeats 1
(llama-bench's tg64 starts from an empty context, hence the 1-token prompt for ours) and
prints one table: prefill 512, decode at short context and after 4096 tokens, the ratio
ours / llama.cpp, as medians and as best-of-rounds. Other processes only ever slow a run
down, so on a shared machine the best of the rounds is the closer estimate of an idle
machine; the medians show what a busy one gives. On a shared machine add `--wait-quiet 120`: each measurement then
waits (up to 120 s) until other processes use under 0.3 cores. This script builds nothing. llama.cpp has no Debian package; build
`llama-bench` from the source bundled in llama-cpp-python's sdist, outside the repo:

    pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/lcpp
    cd /tmp/lcpp && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B /tmp/lcpp/build -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_OPENSSL=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    nice -n 10 cmake --build /tmp/lcpp/build --target llama-bench -j2     # ~7 min on 2 cores

For the comparison without AVX-512 on an AVX-512 machine, build a second llama-bench with
`-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF` and run this script with DS4TUI_KERNELS=avx2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def busy_cores(seconds: float = 2.0) -> float:
    """Cores busy machine-wide over `seconds` (from /proc/stat), to wait for a quiet window."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(1, t1 - t0))


def wait_quiet(limit_s: float, max_busy: float = 0.3) -> float:
    """Wait (up to limit_s) until under max_busy cores are in use; returns the last reading."""
    end = time.monotonic() + limit_s
    while True:
        busy = busy_cores()
        if busy <= max_busy or time.monotonic() >= end:
            return busy


# OpenMP settings llama.cpp must not inherit from the caller: ggml's threads meet at a barrier
# per operation, and with OMP_WAIT_POLICY=PASSIVE (which ds4tui's CLI and our ad-hoc scripts
# set for torch) each wait sleeps: llama-bench's SmolLM2 decode read 47.7 tok/s with it and
# 145.9 without, same binary, same minute (docs/perf-archive.md, "llama.cpp's environment").
LLAMA_ENV_DROP = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES")


def llama_env() -> dict[str, str]:
    """This process's environment without the OpenMP settings above: llama.cpp at its defaults."""
    return {k: v for k, v in os.environ.items() if k not in LLAMA_ENV_DROP}


def llama_bench(exe: str, gguf: Path, threads: int, prompt: int, gen: int, depth: int) -> dict[str, float]:
    """tok/s of one llama-bench run (-r 1): {"pp": .., "tg": ..} for the tests it ran."""
    cmd = [exe, "-m", str(gguf), "-p", str(prompt), "-n", str(gen), "-t", str(threads), "-r", "1", "-o", "json"]
    if depth:
        cmd += ["-d", str(depth)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=llama_env()).stdout
    result = {}
    for rec in json.loads(out):
        key = "pp" if rec["n_gen"] == 0 else "tg"
        result[key] = float(rec["avg_ts"])
    return result


def ours(model: str, threads: int, prompt: int, gen: int) -> dict:
    cmd = [sys.executable, "-m", "ds4tui", "bench", "engine", "--model", model, "--json", "--repeats", "1",
           "--prompt-tokens", str(prompt), "--decode-tokens", str(gen), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout
    return json.loads(out.strip().splitlines()[-1])


def kernel_backend() -> str:
    code = "from ds4tui.engine.kernels import qgemv; print(qgemv.backend())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO).stdout.strip()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# The flags that pick a kernel variant here or in llama.cpp's native build.
SIMD_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq",
              "avx512_vnni", "avx512_bf16", "avx512vbmi")


def cpu_flags() -> str:
    """The SIMD flags of /proc/cpuinfo, in SIMD_FLAGS order."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return " ".join(f for f in SIMD_FLAGS if f in have)
    except OSError:
        pass
    return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", "/tmp/lcpp/build/bin/llama-bench"))
    ap.add_argument("--model", default="smollm2-135m-instruct", help="ds4tui model name (its GGUF is used for both)")
    ap.add_argument("--gguf", type=Path, help="GGUF for llama.cpp (default: the model's registered file)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depth", type=int, default=4096, help="context for the long decode test (0: skip)")
    ap.add_argument("--json", action="store_true", help="also print the raw samples as JSON")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each measurement wait up to S seconds for a quiet machine (shared hosts)")
    args = ap.parse_args()
    exe = shutil.which(args.llama_bench) or args.llama_bench
    if not os.access(exe, os.X_OK):
        print(f"llama-bench not found at {args.llama_bench}: build it as this script's docstring says", file=sys.stderr)
        return 1
    gguf = args.gguf
    if gguf is None:
        sys.path.insert(0, str(REPO))
        from ds4tui.engine.registry import resolve_registered

        gguf = resolve_registered(args.model)
    samples: dict[str, list[float]] = {k: [] for k in
                                       ("lc_pp512", "lc_tg", "lc_tg_d", "our_pp512", "our_tg", "our_tg_d")}
    busy_seen: list[float] = []

    def settle() -> None:
        if args.wait_quiet:
            busy_seen.append(wait_quiet(args.wait_quiet))

    for r in range(args.rounds):
        settle()
        a = llama_bench(exe, gguf, args.threads, 512, 64, 0)
        samples["lc_pp512"].append(a["pp"])
        samples["lc_tg"].append(a["tg"])
        settle()
        samples["our_pp512"].append(ours(args.model, args.threads, 512, 0)["prefill_tok_s"])
        settle()
        samples["our_tg"].append(ours(args.model, args.threads, 1, 64)["decode_tok_s"])
        if args.depth:
            settle()
            samples["lc_tg_d"].append(llama_bench(exe, gguf, args.threads, 0, 64, args.depth)["tg"])
            settle()
            samples["our_tg_d"].append(ours(args.model, args.threads, args.depth, 64)["decode_tok_s"])
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in samples.items() if v),
              file=sys.stderr)
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    rows = [("prefill 512 tokens", "our_pp512", "lc_pp512"), ("decode 64, short context", "our_tg", "lc_tg")]
    if args.depth:
        rows.append((f"decode 64 after {args.depth} tokens", "our_tg_d", "lc_tg_d"))
    print(f"{datetime.date.today().isoformat()}, {cpu_name()}, {os.cpu_count()} CPUs, {args.threads} threads, "
          f"kernels: {kernel_backend()}, medians of {args.rounds} alternating rounds, tok/s")
    print(f"CPU flags: {cpu_flags()}; load average at the end: {os.getloadavg()[0]:.1f}")
    dropped = [k for k in LLAMA_ENV_DROP if k in os.environ]
    if dropped:
        print(f"llama-bench ran without this shell's {', '.join(dropped)} (llama.cpp's defaults)")
    if busy_seen:
        print(f"other load before each measurement: {min(busy_seen):.2f}-{max(busy_seen):.2f} busy cores")
    best = {k: max(v) for k, v in samples.items() if v}
    print("| test | ds4tui | llama.cpp | ratio | best ds4tui | best llama.cpp | best ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, o, ll in rows:
        print(f"| {label} | {med[o]:.1f} | {med[ll]:.1f} | {med[o] / med[ll]:.2f}x "
              f"| {best[o]:.1f} | {best[ll]:.1f} | {best[o] / best[ll]:.2f}x |")
    if args.json:
        print(json.dumps({"samples": samples, "medians": med}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
