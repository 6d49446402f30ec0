"""The browser follows a directory that another process changes: save, hit (touch), delete."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.ui import kv_fixtures as fx
from tests.ui.browser_app import BrowserHost, until

ROOT = Path(__file__).resolve().parents[2]
NEW_TEXT = "<|im_start|>system\nA checkpoint saved by another ds4tui.<|im_end|>\n"

# Another process using the cache core as the chat would: atomic save, a hit, a delete.
_OTHER = textwrap.dedent(
    """
    import sys
    from ds4tui.cache.entry import Acceptor
    from ds4tui.cache.store import KvStore
    d, op, arg = sys.argv[1:4]
    store = KvStore(d)
    if op == "save":
        payload = b"DSV4" + bytes(100)
        r = store.save(arg, tokens=24, reason="cold", engine=Acceptor(model_id=0x80, ctx_size=8192),
                       payload_bytes=len(payload), write_payload=lambda fp: fp.write(payload))
        assert r.ok, r.event
        print(r.event.sha)
    elif op == "touch":
        assert store.touch(arg)
    elif op == "delete":
        assert store.delete(arg)
    """
)


def _other_process(directory: Path, op: str, arg: str) -> str:
    out = subprocess.run([sys.executable, "-c", _OTHER, str(directory), op, arg], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


async def test_table_follows_another_process_and_keeps_the_selection(tmp_path):
    """Files saved, touched and deleted by another process appear, update and vanish; the cursor stays put."""
    kept = fx.cold_checkpoint(tmp_path)
    app = BrowserHost(tmp_path, watch=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.shown == (kept,), "the first scan")
        browser = app.browser

        new = _other_process(tmp_path, "save", NEW_TEXT)
        await until(pilot, lambda: new in app.shown, "the saved file to appear")
        assert browser.selected.sha == kept

        _other_process(tmp_path, "touch", kept)
        await until(pilot, lambda: browser.listing.by_sha[kept].header.hits == 1, "the hit count to update")
        assert browser.selected.sha == kept

        _other_process(tmp_path, "delete", new)
        await until(pilot, lambda: app.shown == (kept,), "the deleted file to vanish")
        assert browser.selected.sha == kept


async def test_directory_removed_and_refilled(tmp_path):
    """`rm -r` of the cache directory empties the table; files saved there afterwards still show up."""
    import shutil

    directory = tmp_path / "kv"
    fx.cold_checkpoint(directory)
    app = BrowserHost(directory, watch=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: len(app.shown) == 1, "the first scan")
        shutil.rmtree(directory)
        await until(pilot, lambda: app.shown == () and directory.is_dir(), "the empty, re-watched directory")
        new = _other_process(directory, "save", NEW_TEXT)
        await until(pilot, lambda: app.shown == (new,), "a file saved into the new directory")
