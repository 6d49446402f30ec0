"""Benchmarks behind `ds4tui bench <what>`: one module per subcommand (see ds4tui/cli/bench.py).

Each module exposes `add_bench_command(subparsers)` and imports torch or the
engine only inside the command, so `ds4tui --help` stays fast.
"""
