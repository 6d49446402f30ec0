"""Copying text out of the chat, and saying truthfully where it went.

Owns: the choice of route for one copy and the sentence the toast shows. A terminal
copies by OSC 52, but nothing confirms that it took the text: tmux drops it unless its
`set-clipboard` is `on` (the default, `external`, ignores applications), GNU screen drops
it, and many terminals (GNOME Terminal/VTE, xterm by default, Apple's Terminal) ignore it.
So, in order:
1. on a local desktop (no SSH), the system's own clipboard tool (wl-copy, xclip, xsel,
   pbcopy): its exit status confirms the copy;
2. OSC 52 where it is likely to work: a terminal known to take it, or tmux with
   `set-clipboard on`;
3. otherwise the text is written to a file (paths.clipboard_file(), mode 0600: a copy may
   hold a secret) and the toast names it and says why; OSC 52 is sent anyway.
Leaves to callers: the OSC 52 writer (Textual's App.copy_to_clipboard, which also keeps
the text for pasting inside the app).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from ds4tui import paths

# TERM prefixes and TERM_PROGRAM values of terminals that take OSC 52 copies by default.
OSC52_TERMS = ("xterm-kitty", "alacritty", "foot", "xterm-ghostty", "wezterm", "contour", "rio")
OSC52_PROGRAMS = ("iTerm.app", "WezTerm", "ghostty", "rio", "Tabby")
# Variables only those terminals set (TERM may be a plain xterm-256color there).
OSC52_VARIABLES = ("KITTY_WINDOW_ID", "WEZTERM_PANE", "WT_SESSION", "ALACRITTY_WINDOW_ID", "GHOSTTY_RESOURCES_DIR")
TOOL_TIMEOUT_S = 2.0  # a clipboard tool reads stdin and returns (xclip forks to serve it)


@dataclass(frozen=True)
class Copied:
    """How one copy went: `route` is "tool", "osc52" or "file"; `message` is the toast."""

    route: str
    message: str
    path: Path | None = None  # the file, for route "file"

    @property
    def severity(self) -> str:
        """The toast's: a copy that went only to a file is worth a second look."""
        return "warning" if self.route == "file" else "information"


def _tools(env: Mapping[str, str], platform: str) -> list[list[str]]:
    """The system clipboard commands this session could use, best first."""
    if env.get("SSH_CONNECTION") or env.get("SSH_TTY"):
        return []  # they would copy on the remote machine, not the user's
    if platform == "darwin":
        return [["pbcopy"]]
    found = []
    if env.get("WAYLAND_DISPLAY"):
        found.append(["wl-copy"])
    if env.get("DISPLAY"):
        found += [["xclip", "-selection", "clipboard"], ["xsel", "--clipboard", "--input"]]
    return found


def tmux_set_clipboard() -> str:
    """tmux's global `set-clipboard` ("on", "external", "off"), "" when tmux cannot say."""
    try:
        done = subprocess.run(["tmux", "show-options", "-gv", "set-clipboard"], capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def osc52_doubt(env: Mapping[str, str], tmux_option: Callable[[], str] | None = None) -> str | None:
    """None when an OSC 52 copy is likely to reach the clipboard here; else why not (a clause)."""
    if env.get("TMUX"):
        value = (tmux_option or tmux_set_clipboard)()
        if value == "on":
            return None
        return (f"tmux's set-clipboard is {value or 'unknown'} (`set -g set-clipboard on` lets copies through)")
    if env.get("STY"):
        return "GNU screen passes no OSC 52 copies"
    term = env.get("TERM", "")
    if term.startswith(OSC52_TERMS) or env.get("TERM_PROGRAM", "") in OSC52_PROGRAMS:
        return None
    if any(env.get(name) for name in OSC52_VARIABLES):
        return None
    return f"TERM={term or 'unset'} is not known to take OSC 52 copies"


def _run_tool(command: list[str], text: str) -> bool:
    if shutil.which(command[0]) is None:
        return False
    try:
        done = subprocess.run(command, input=text.encode("utf-8"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def write_file(text: str, path: Path) -> None:
    """Write the copy, readable by its owner only (0600 from creation: never a moment wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fp:
        fp.write(text)
    os.replace(tmp, path)


def copy_text(text: str, what: str, osc52: Callable[[str], None], *, env: Mapping[str, str] | None = None,
              platform: str = sys.platform, tmux_option: Callable[[], str] | None = None,
              run_tool: Callable[[list[str], str], bool] = _run_tool) -> Copied:
    """Copy `text` (`what` names it in the message: "the reply", "code block 2") by the best route."""
    env = os.environ if env is None else env
    osc52(text)  # always: it costs nothing, and an unlisted terminal may take it
    size = f"{len(text):,} character{'s' if len(text) != 1 else ''}"
    for command in _tools(env, platform):
        if run_tool(command, text):
            return Copied("tool", f"Copied {what} ({size}, {command[0]})")
    doubt = osc52_doubt(env, tmux_option)
    if doubt is None:
        return Copied("osc52", f"Copied {what} ({size}, OSC 52)")
    path = paths.clipboard_file()
    try:
        write_file(text, path)
    except OSError as exc:
        return Copied("osc52", f"Sent {what} by OSC 52, which may not arrive: {doubt}; "
                               f"and {path} could not be written: {exc.strerror or exc}")
    return Copied("file", f"Saved {what} ({size}) to {path}: the terminal may not take the copy, {doubt}", path)
