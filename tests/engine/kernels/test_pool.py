"""The kernels' thread pool (kernels/pool.c) under a stress of back-to-back jobs.

A C driver built with the system compiler runs jobs of 40 and 2 chunks in turn on two
threads and counts, per job, chunks run other than once and returns of the caller while a
chunk still ran. A worker preempted between loading the claim word and its bounds check
used to compare a finished job's word with the next job's chunk count and claim from it:
~400 such chunks in 200,000 jobs on a 2-core VM, and segfaults of a cold prefill (a chunk
of attention still running after the caller freed its partial sums)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ds4tui.engine.kernels import build, qgemv

KERNELS = Path(qgemv.__file__).parent
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pool.c"
#define MAXC 64
typedef struct { _Atomic int count[MAXC]; _Atomic int running; int64_t n; } job_t;
static _Atomic long outside = 0;
static void chunk(void *ctx, int64_t c) {
    job_t *j = ctx;
    if (c < 0 || c >= j->n) { atomic_fetch_add(&outside, 1); return; }
    atomic_fetch_add(&j->running, 1);
    atomic_fetch_add(&j->count[c], 1);
    for (volatile int i = 0; i < 50; i++) {}
    atomic_fetch_sub(&j->running, 1);
}
int main(int argc, char **argv) {
    long iters = atol(argv[1]), wrong = 0, early = 0;
    static job_t jobs[2];
    for (long it = 0; it < iters; it++) {
        job_t *j = &jobs[it & 1];
        memset(j, 0, sizeof *j);
        j->n = (it & 1) ? 2 : 40;
        ds4k_run_chunks(chunk, j, j->n, 2);
        if (atomic_load(&j->running) != 0) early++;
        for (int c = 0; c < j->n; c++) wrong += atomic_load(&j->count[c]) != 1;
    }
    printf("%ld %ld %ld\n", wrong, early, (long)atomic_load(&outside));
    return 0;
}
"""


def test_back_to_back_jobs_run_every_chunk_once_and_the_caller_waits_for_them(tmp_path):
    cc = build.find_compiler()
    if cc is None:
        pytest.skip("no C compiler: the kernels (and their pool) are not built here")
    src = tmp_path / "pool_stress.c"
    src.write_text(DRIVER)
    exe = tmp_path / "pool_stress"
    subprocess.run([cc, "-O2", "-pthread", f"-I{KERNELS}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe), "200000"], capture_output=True, text=True, check=True, timeout=120)
    wrong, early, outside = (int(v) for v in out.stdout.split())
    assert (wrong, early, outside) == (0, 0, 0)
