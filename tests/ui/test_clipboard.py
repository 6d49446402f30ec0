"""Where a copy goes (screens/clipboard.py): a confirmed system tool, OSC 52 where it is likely
to arrive, else a file named in the message."""

from __future__ import annotations

from ds4tui.screens.clipboard import copy_text, osc52_doubt


def test_osc52_is_trusted_only_where_it_is_likely_to_arrive():
    assert osc52_doubt({"TERM": "xterm-kitty"}) is None
    assert osc52_doubt({"TERM": "xterm-256color", "WEZTERM_PANE": "1"}) is None
    assert osc52_doubt({"TERM": "xterm-256color", "TERM_PROGRAM": "iTerm.app"}) is None
    assert "TERM=xterm-256color" in osc52_doubt({"TERM": "xterm-256color", "VTE_VERSION": "7600"})  # GNOME
    assert "TERM=unset" in osc52_doubt({})
    assert "GNU screen" in osc52_doubt({"TERM": "screen", "STY": "1.pts-0"})
    inside = {"TERM": "tmux-256color", "TMUX": "/tmp/tmux-0/default,1,0", "KITTY_WINDOW_ID": "1"}
    assert osc52_doubt(inside, lambda: "on") is None  # tmux passes it on (and keeps a buffer)
    assert "set-clipboard is external" in osc52_doubt(inside, lambda: "external")  # tmux's default
    assert "set-clipboard is unknown" in osc52_doubt(inside, lambda: "")


def test_a_local_desktop_tool_is_used_first_and_never_over_ssh(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4TUI_CLIPBOARD_FILE", str(tmp_path / "clip.txt"))
    sent, ran = [], []

    def tool(command, text):
        ran.append((command[0], text))
        return command[0] == "xclip"

    done = copy_text("abc", "the reply", sent.append, env={"DISPLAY": ":0", "TERM": "xterm"}, platform="linux",
                     run_tool=tool)
    assert (done.route, done.message) == ("tool", "Copied the reply (3 characters, xclip)")
    assert sent == ["abc"] and ran == [("xclip", "abc")]
    ran.clear()
    done = copy_text("abc", "the reply", sent.append, env={"DISPLAY": ":0", "TERM": "xterm", "SSH_TTY": "/dev/pts/1"},
                     platform="linux", run_tool=tool)
    assert ran == [] and done.route == "file"  # over SSH the tool would copy on the wrong machine
    assert (tmp_path / "clip.txt").read_text() == "abc" and str(tmp_path / "clip.txt") in done.message
    done = copy_text("x", "the message", sent.append, env={"TERM": "foot"}, platform="linux", run_tool=tool)
    assert done.message == "Copied the message (1 character, OSC 52)"
