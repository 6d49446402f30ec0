"""ds4tui.cache (and the `kv` command) stay pure Python: no torch, Textual or Rich on import."""

from __future__ import annotations

import subprocess
import sys


def test_cache_and_kv_cli_import_without_torch_textual_or_rich():
    code = (
        "import sys\n"
        "import ds4tui.cache, ds4tui.cache.store, ds4tui.format.kvc, ds4tui.cache.policy\n"
        "import ds4tui.cache.entry, ds4tui.cache.events, ds4tui.cache.eviction, ds4tui.cache.files\n"
        "import ds4tui.cli.kv\n"
        "heavy = [m for m in ('torch', 'textual', 'rich') if m in sys.modules]\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
