"""The page-cache helpers behind `ds4tui bench cache`'s cold-page-cache hit, and how the
bench decides whether an eviction took."""

import os

import pytest

from ds4tui.bench import page_cache as pc
from ds4tui.bench.cache_bench import _eviction_took

# Filesystems whose clean pages POSIX_FADV_DONTNEED drops (tmpfs has no disk to drop them to).
DISK_FILESYSTEMS = {"ext4", "ext3", "xfs", "btrfs", "f2fs"}


def _fs_type(path) -> str | None:
    best, fs = "", None
    real = os.path.realpath(path)
    with open("/proc/mounts") as fp:
        for line in fp:
            _, mount, kind, *_ = line.split()
            if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, fs = mount, kind
    return fs


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(3 << 20) + b"tail")  # not a whole number of pages
    return path


def test_a_file_just_read_is_resident(data_file):
    pc.warm(data_file)
    assert pc.resident_fraction(data_file) == 1.0
    empty = data_file.with_name("empty")
    empty.write_bytes(b"")
    assert pc.resident_fraction(empty) == 1.0


def test_evict_drops_the_file_from_the_page_cache(data_file):
    fs = _fs_type(data_file)
    if fs not in DISK_FILESYSTEMS:
        pytest.skip(f"{fs}: no backing store for POSIX_FADV_DONTNEED to drop pages to")
    pc.warm(data_file)
    pc.evict(data_file)
    assert pc.resident_fraction(data_file) < 0.01
    with open(data_file, "rb") as fp:  # reading brings it back
        fp.read()
    assert pc.resident_fraction(data_file) == 1.0


def _run(resident, evicted_ms=100.0, cached_ms=20.0):
    return {"resident": resident, "raw_read_evicted_ms": evicted_ms, "raw_read_cached_ms": cached_ms}


def test_eviction_verdict_prefers_mincore_then_timing():
    assert _eviction_took([_run(0.0), _run(0.004)]) is True
    assert _eviction_took([_run(0.0), _run(0.3)]) is False  # one run started half cached
    assert _eviction_took([_run(None, 100.0, 20.0)]) is True  # no mincore: the evicted read was slower
    assert _eviction_took([_run(None, 22.0, 20.0)]) is False
    assert _eviction_took([_run(None, None, None)]) is None
