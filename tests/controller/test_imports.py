"""The controller is headless: importing it must not pull in Textual or Rich."""

from __future__ import annotations

import subprocess
import sys


def test_controller_imports_no_ui_packages():
    code = (
        "import sys, ds4tui.chat.controller, ds4tui.chat.streaming, ds4tui.config;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
