"""process_memory reads a process's resident set from /proc/PID/status (bench serve's RSS columns)."""

import os
import subprocess
import sys

import pytest

from ds4tui.bench.server_process import process_memory

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")


def _statm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as fp:
        return int(fp.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_child_that_touches_memory_shows_it_in_rss_and_peak():
    # A child that fills 200 MB, frees it, then waits: its peak keeps the 200 MB, its RSS drops.
    code = ("import sys; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); del b;"
            "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        mem = process_memory(child.pid)
        assert mem["VmHWM"] >= 200 * 2**20
        assert mem["VmRSS"] < mem["VmHWM"] - 150 * 2**20
        assert abs(mem["VmRSS"] - _statm_rss(child.pid)) < 8 * 2**20
        assert mem["RssAnon"] + mem["RssFile"] <= mem["VmRSS"]
    finally:
        child.communicate("\n")


def test_gone_process_reads_zeros():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_memory(child.pid) == {"VmHWM": 0, "VmRSS": 0, "RssAnon": 0, "RssFile": 0}
