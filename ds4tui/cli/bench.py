"""`ds4tui bench <what>`: benchmarks. This module only gathers the subcommands.

Each benchmark lives in its own module under ds4tui/bench/ and exposes
`add_bench_command(subparsers)`, which adds its subcommand and sets `func`.
To add one, write the module and list it in BENCH_MODULES.
"""

from __future__ import annotations

import argparse
import importlib

# In the order `ds4tui bench --help` lists them.
BENCH_MODULES = [
    "ds4tui.bench.engine_bench",  # bench engine: prefill/decode speed, payload size, save/load speed
    "ds4tui.bench.cache_bench",  # bench cache: cold vs disk-hit TTFT of one conversation (chat controller)
    "ds4tui.bench.startup_bench",  # bench startup: first paint, typing-ready, model-ready of the chat (pty)
    "ds4tui.bench.swa_bench",  # bench swa: file size, restore and recompute per SWA storage policy
    "ds4tui.bench.checksum_bench",  # bench checksum: restore time with and without the .kv checksum
    "ds4tui.bench.reliability",  # bench reliability: fault injection against the disk cache
    "ds4tui.bench.serve_bench",  # bench serve: ds4tui serve at 1/4/8 clients vs the embedded engine
]


def register(subparsers) -> None:
    bench = subparsers.add_parser(
        "bench", help="measure the engine and the cache",
        description="Benchmarks. Each prints a table, or JSON with --json.",
    )
    sub = bench.add_subparsers(title="benchmarks", metavar="WHAT")
    for name in BENCH_MODULES:
        importlib.import_module(name).add_bench_command(sub)

    def show_help(args: argparse.Namespace) -> int:
        bench.print_help()
        return 0

    bench.set_defaults(func=show_help)
