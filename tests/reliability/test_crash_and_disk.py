"""Crashes, full disks and a shared directory: no partial file is ever visible, no temp file outlives
the next start, a pin holds under eviction pressure from two processes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from ds4tui.cache import Acceptor, KvStore
from ds4tui.cache import files as cache_files
from ds4tui.cache.index import INDEX_NAME
from ds4tui.cache.integrity import HashingWriter
from tests.cache.kvc_builders import dsv4_payload

ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)
ROOT = str(Path(__file__).resolve().parents[2])

_SLOW_SAVER = r"""
import sys, time, threading
sys.path.insert(0, {root!r})
from ds4tui.cache import Acceptor, KvStore
from tests.cache.kvc_builders import dsv4_payload
store = KvStore({directory!r})
head = dsv4_payload(5)
def write(fp):
    fp.write(head)
    for _ in range(200):
        fp.write(b"\x01" * 4096)
        fp.flush()
        time.sleep(0.01)
def save():
    store.save(b"slow save", tokens=5, reason="cold", engine=Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8),
               payload_bytes=len(head) + 200 * 4096, write_payload=write)
if {in_thread!r}:
    threading.Thread(target=save, daemon=True).start()
    time.sleep(0.3)  # the main thread ends mid-save: a clean interpreter exit
else:
    save()
"""


def _spawn_slow_saver(directory: Path, in_thread: bool) -> subprocess.Popen:
    code = _SLOW_SAVER.format(root=ROOT, directory=str(directory), in_thread=in_thread)
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_for_tmp(directory: Path, proc: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while time.time() < deadline:
        if directory.exists() and any(".tmp." in n for n in os.listdir(directory)):
            return
        assert proc.poll() is None, "the saver ended before writing"
        time.sleep(0.01)
    raise AssertionError("no temp file appeared")


def test_kill_9_mid_save_leaves_no_visible_file_and_the_next_start_removes_the_temp(tmp_path):
    for _ in range(3):
        proc = _spawn_slow_saver(tmp_path, in_thread=False)
        _wait_for_tmp(tmp_path, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not any(n.endswith(".kv") for n in os.listdir(tmp_path))  # nothing partial is visible
        assert any(".tmp." in n for n in os.listdir(tmp_path))
        KvStore(tmp_path).scan()  # the next start's first scan
        assert os.listdir(tmp_path) == []


def test_a_clean_exit_mid_save_leaves_no_temp_file(tmp_path):
    proc = _spawn_slow_saver(tmp_path, in_thread=True)
    assert proc.wait(timeout=300) == 0
    assert [n for n in os.listdir(tmp_path) if ".tmp." in n] == []


def test_live_temp_files_count_toward_the_budget(tmp_path):
    store = KvStore(tmp_path, budget_mb=1)
    data = dsv4_payload(5, body=b"\0" * 300_000)
    for text in (b"one", b"two"):
        assert store.save(text, tokens=5, reason="cold", engine=ENGINE, payload_bytes=len(data),
                          write_payload=lambda fp: fp.write(data)).ok
    # Another process (our parent: alive) is writing 600 KB: only one of ours still fits beside it.
    (tmp_path / f"{'a' * 40}.kv.tmp.{os.getppid()}.beef").write_bytes(b"\0" * 600_000)
    assert store.temp_bytes() == 600_000
    ev = store.evict()
    assert len(ev.files) == 1 and len(store.shas()) == 1


def test_enospc_mid_payload_is_a_save_failure_with_no_trace(tmp_path, monkeypatch):
    store = KvStore(tmp_path)
    data = dsv4_payload(5, body=b"\2" * 10_000)
    kept = store.save(b"kept", tokens=5, reason="cold", engine=ENGINE, payload_bytes=len(data),
                      write_payload=lambda fp: fp.write(data)).event
    before = Path(kept.path).read_bytes()
    written = {"n": 0}
    real_write = HashingWriter.write

    def full_disk(self, chunk):
        written["n"] += len(chunk)
        if written["n"] > 4000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, chunk)
    monkeypatch.setattr(HashingWriter, "write", full_disk)
    res = store.save(b"kept and more", tokens=5, reason="cold", engine=ENGINE, payload_bytes=len(data),
                     write_payload=lambda fp: [fp.write(data[i:i + 1000]) for i in range(0, len(data), 1000)])
    assert not res.ok and res.event.reason.startswith("disk full (ENOSPC)")
    assert sorted(set(os.listdir(tmp_path)) - {INDEX_NAME}) == [Path(kept.path).name]  # the index: a cache
    assert Path(kept.path).read_bytes() == before


def test_enospc_in_the_chat_answers_and_reports(tmp_path, monkeypatch):
    from ds4tui.cache.events import SaveFailed
    from ds4tui.engine.loader import load_model
    from tests.chat.conftest import Recorder, make_controller

    ctl = make_controller(load_model("tiny-llama"), tmp_path)

    def no_space(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(cache_files.os, "fsync", no_space)
    rec = Recorder()
    conv = ctl.new_conversation()
    ctl.send(conv.key, "hello there", rec)
    assert rec.reply and any(isinstance(e, SaveFailed) and "ENOSPC" in e.reason for e in rec)
    assert [n for n in os.listdir(tmp_path) if ".tmp." in n or n.endswith(".kv")] == []


_PRESSURE = r"""
import sys, json
sys.path.insert(0, {root!r})
from ds4tui.cache import Acceptor, KvStore
from tests.cache.kvc_builders import dsv4_payload
store = KvStore({directory!r}, budget_mb=1)
errors = 0
for i in range({rounds}):
    text = ("%s %d" % (sys.argv[1], i)).encode()
    data = dsv4_payload(5, body=bytes([i % 256]) * 150_000)
    res = store.save(text, tokens=5, reason="cold", engine=Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8),
                     payload_bytes=len(data), write_payload=lambda fp: fp.write(data))
    errors += not res.ok
print(json.dumps(errors))
"""


def test_two_processes_under_eviction_pressure_keep_the_pin(tmp_path):
    store = KvStore(tmp_path, budget_mb=1)
    data = dsv4_payload(5, body=b"\7" * 150_000)
    pinned = store.save(b"pinned", tokens=5, reason="cold", engine=ENGINE, payload_bytes=len(data),
                        write_payload=lambda fp: fp.write(data), pinned=True).event
    code = _PRESSURE.format(root=ROOT, directory=str(tmp_path), rounds=25)
    procs = [subprocess.Popen([sys.executable, "-c", code, who], stdout=subprocess.PIPE, text=True)
             for who in ("left", "right")]
    while any(p.poll() is None for p in procs):  # `kv ls` and `kv evict` in a loop meanwhile
        for e in store.entries():
            assert e.valid or e.error == "file not found", e.error
        store.evict()
    assert [json.loads(p.communicate()[0]) for p in procs] == [0, 0]
    entries = store.entries(verify=True)
    assert pinned.sha in {e.sha for e in entries} and all(e.valid and e.checksum == "ok" for e in entries)
    assert sum(e.file_bytes for e in entries) <= store.budget_bytes
    assert [n for n in os.listdir(tmp_path) if ".tmp." in n] == []
