"""Changing settings in the user's config file in place.

Owns: `update_config_file`, which sets or removes a few keys of the TOML config file
(top-level keys, and entries of one table such as `[system_prompts]`) and leaves every
other line as the user wrote it: their comments, their order, keys ds4tui does not
change, a comment at the end of a changed line. The new text is parsed and checked
(`config.from_mapping`) before it replaces the file, atomically (a temporary file in
the same directory, fsync, rename), so a crash or a full disk leaves the old file whole
and a file ds4tui cannot edit safely is left alone with a message that says so.
Leaves to config.py what each key means and which values are valid.
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Mapping

from ds4tui import paths
from ds4tui.config import Config, ConfigError, _toml_value, from_mapping, toml_key


def _parses(text: str) -> dict | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def _path_of(parsed: dict) -> tuple[str, ...]:
    """The key path a one-statement document sets: `[a.b]` -> (a, b), `a.b = 1` -> (a, b)."""
    out: list[str] = []
    node: Any = parsed
    while isinstance(node, dict) and len(node) == 1:
        key = next(iter(node))
        out.append(key)
        node = node[key]
    return tuple(out)


class _Statement:
    """Lines [start, end) of the file: a key/value (`key` is its first key), a table header
    (`header` is its path), or anything else (blank lines, comments)."""

    def __init__(self, start: int, end: int, key: str | None = None, header: tuple[str, ...] | None = None):
        self.start, self.end, self.key, self.header = start, end, key, header


def _statements(lines: list[str]) -> list[_Statement]:
    out: list[_Statement] = []
    i = 0
    while i < len(lines):
        text = lines[i].strip()
        if not text or text.startswith("#"):
            out.append(_Statement(i, i + 1))
            i += 1
            continue
        if text.startswith("["):
            parsed = _parses(lines[i])
            if parsed is None or text.startswith("[["):
                raise ConfigError(f"line {i + 1}: a table header ds4tui cannot edit around")
            out.append(_Statement(i, i + 1, header=_path_of(parsed)))
            i += 1
            continue
        # A value may span lines (a multi-line string or array): the shortest run that parses.
        for j in range(i + 1, len(lines) + 1):
            parsed = _parses("".join(lines[i:j]))
            if parsed is not None:
                break
        else:
            raise ConfigError(f"line {i + 1}: not valid TOML")
        out.append(_Statement(i, j, key=next(iter(parsed), None)))
        i = j
    return out


def _trailing_comment(line: str) -> str:
    """The comment at the end of a one-line key/value (with the spaces before it), or ""."""
    body = line.rstrip("\n")
    whole = _parses(body)
    for match in re.finditer("#", body):
        if _parses(body[: match.start()]) == whole:
            head = body[: match.start()]
            return body[len(head.rstrip()) :]
    return ""


def _line(key: str, value: Any, old: str | None = None) -> str:
    comment = _trailing_comment(old) if old is not None and old.count("\n") <= 1 else ""
    return f"{toml_key(key)} = {_toml_value(value)}{comment}\n"


def _set_in(lines: list[str], section: range, statements: list[_Statement], key: str, value: Any) -> list[str]:
    """`lines` with `key` set (value None: removed) among the statements inside `section`."""
    mine = [s for s in statements if s.start in section and s.key is not None]
    for s in mine:
        if s.key == key:
            new = [] if value is None else [_line(key, value, "".join(lines[s.start : s.end]))]
            return lines[: s.start] + new + lines[s.end :]
    if value is None:
        return lines
    if mine:
        at = mine[-1].end
    else:
        at = section.stop
        # Comments right above the next table header belong to that header.
        while at > section.start and lines[at - 1].strip().startswith("#") and at != len(lines):
            at -= 1
    if at > 0 and not lines[at - 1].endswith("\n"):
        lines = lines[: at - 1] + [lines[at - 1] + "\n"] + lines[at:]
    return lines[:at] + [_line(key, value)] + lines[at:]


def edit_text(text: str, changes: Mapping[str, Any], tables: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The config text with top-level `changes` applied and `tables[name][key]` set (a value of
    None removes the key). Lines not changed stay as they were."""
    lines = text.splitlines(keepends=True)
    for key, value in changes.items():
        statements = _statements(lines)
        first_header = next((s.start for s in statements if s.header is not None), len(lines))
        lines = _set_in(lines, range(0, first_header), statements, key, value)
    for table, entries in (tables or {}).items():
        for key, value in entries.items():
            statements = _statements(lines)
            headers = [s for s in statements if s.header is not None]
            mine = next((s for s in headers if s.header == (table,)), None)
            if mine is None:
                if value is None:
                    continue
                if lines and not lines[-1].endswith("\n"):
                    lines[-1] += "\n"
                lines += (["\n"] if lines and lines[-1].strip() else []) + [f"[{toml_key(table)}]\n"]
                lines.append(_line(key, value))
                continue
            end = next((s.start for s in headers if s.start > mine.start), len(lines))
            # A blank line before the next header stays before it.
            while end - 1 > mine.start and not lines[end - 1].strip():
                end -= 1
            lines = _set_in(lines, range(mine.start + 1, end), statements, key, value)
    return "".join(lines)


def _expected(old: dict, changes: Mapping[str, Any], tables: Mapping[str, Mapping[str, Any]]) -> dict:
    new = {k: v for k, v in old.items()}
    for key, value in changes.items():
        if value is None:
            new.pop(key, None)
        else:
            new[key] = value
    for table, entries in tables.items():
        inner = dict(new.get(table, {}))
        for key, value in entries.items():
            if value is None:
                inner.pop(key, None)
            else:
                inner[key] = value
        if inner or table in new:
            new[table] = inner
    return new


def update_config_file(changes: Mapping[str, Any] | None = None, *,
                       tables: Mapping[str, Mapping[str, Any]] | None = None,
                       path: str | os.PathLike | None = None) -> Path:
    """Set (None: remove) `changes` and `tables[name][key]` in the config file, keeping the rest
    of it as it is. Raises ConfigError, the file untouched, when it cannot be read, is not
    valid TOML, or the result would not be the intended settings; OSError when it cannot be
    written. Returns the path written (a symlink's target is replaced, the link kept)."""
    changes, tables = dict(changes or {}), {k: dict(v) for k, v in (tables or {}).items()}
    file = Path(path) if path is not None else paths.config_path()
    file = Path(os.path.realpath(file))
    try:
        text = file.read_text(encoding="utf-8")
        mode = file.stat().st_mode & 0o7777
    except FileNotFoundError:
        text, mode = "", None
    except UnicodeDecodeError:
        raise ConfigError(f"{file}: not UTF-8 text; not changed") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read ({exc.strerror or exc})") from None
    old = _parses(text)
    if old is None:
        raise ConfigError(f"{file}: not valid TOML; not changed (fix it by hand, or remove it)")
    try:
        new_text = edit_text(text, changes, tables)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}; not changed") from None
    parsed = _parses(new_text)
    if parsed != _expected(old, changes, tables):
        raise ConfigError(f"{file}: its layout cannot be edited in place; not changed (edit it by hand)")
    from_mapping(parsed, where=str(file))  # every value valid, or ConfigError naming the key
    if not text:
        new_text = "# ds4tui settings (see `ds4tui --help`); command-line flags override them.\n" + new_text
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(new_text)
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, file)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return file


def saved_changes(current: Config, values: Mapping[str, Any]) -> dict:
    """The keys of `values` worth writing: those that differ from the file's own settings
    (`current`), so saving the settings form adds no line for a value left at its default."""
    return {k: v for k, v in values.items() if getattr(current, k) != v}
