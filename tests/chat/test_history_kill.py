"""kill -9 of a chat in the middle of its replies, 20 times over one store: every start
finds the file sound and every turn that was committed before the kill."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from ds4tui.store import open_store

pytestmark = pytest.mark.slow  # 20 fresh interpreters, each loading torch and a tiny model

CHILD = textwrap.dedent("""
    import sys
    from ds4tui.chat.controller import ChatController
    from ds4tui.config import Config
    from ds4tui.engine.loader import load_model

    model = load_model("tiny-llama")
    ctl = ChatController(model, Config(model="tiny-llama", temperature=1.0, max_tokens=24,
                                       cache_dir=sys.argv[1]))
    chat_id = sys.argv[2] if len(sys.argv) > 2 else None
    conv = ctl.open_stored(chat_id) if chat_id else ctl.new_conversation()
    turn = 0
    while True:
        # 24 tokens a reply: 20 runs of one or two turns stay well inside the context.
        done = ctl.send(conv.key, f"turn {turn}", lambda e: None)
        assert done is not None
        # Committed when send returns: the parent counts on every line printed.
        sys.stdout.write(f"{conv.store_id} {len(conv.messages)}\\n")
        sys.stdout.flush()
        turn += 1
""")


def test_kill_9_during_replies_loses_no_committed_turn(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    rng = random.Random(11)
    chat_id, committed = None, 0
    for round_ in range(20):
        argv = [sys.executable, "-c", CHILD, str(tmp_path / "kv")] + ([chat_id] if chat_id else [])
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        first = proc.stdout.readline().split()  # one turn committed, then a kill while replying
        assert first, proc.stderr.read()
        lines = [first]
        if rng.random() < 0.5:  # or one more turn first
            lines.append(proc.stdout.readline().split())
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate()
        lines += [line.split() for line in rest.split("\n")[:-1] if len(line.split()) == 2]
        chat_id, shown = lines[-1][0], int(lines[-1][1])
        store = open_store(os.environ["DS4TUI_STORE"])
        assert store.notice is None and store.integrity() == "ok", round_
        loaded = store.load(chat_id)
        # Every committed turn is there; at most the message being answered is more.
        assert len(loaded.messages) in (shown, shown + 1), round_
        assert len(loaded.messages) >= committed
        committed = shown
        store.close()
