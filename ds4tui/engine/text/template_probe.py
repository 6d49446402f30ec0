"""What a model's chat template writes on its own, found by rendering probe conversations:
the system turn it adds when a chat has none (Llama 3.1's "Cutting Knowledge Date: ..."
header, a ChatML default system prompt), the text it wraps around a system message the chat
does have, and the dates it asks `strftime_now` for.

Why: a stored transcript is parsed back into messages (a resumed chat, a fork from disk) and
the messages are rendered again for the next turn. When the parser reads a template's own
header as the user's system message, the next render writes the header twice, the prompt no
longer starts with the cached text and the turn misses the disk cache. `SystemInjection`
turns those parsed messages back into the ones that render the same text.

Owns: the probes, the patterns they give (each date a wildcard, so text rendered on another
day still matches) and reading the dates back from a match. Rendering and parsing belong to
the caller (engine/text/chat_templates.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Sequence

# What `strftime_now` returns during a probe: a mark no template text contains, numbered by call.
_MARK = "\x00date{}\x00"
_MARK_RE = re.compile("\x00date(\\d+)\x00")
_PROBE_USER = "ds4tui-probe-user"
_PROBE_SYSTEM = "ds4tui-probe-system"

StrftimeNow = Callable[[str], str]
# render(messages, strftime_now) -> the text without a generation prompt
Render = Callable[[list, StrftimeNow], str]
Parse = Callable[[str], list]


@dataclass
class _Recorder:
    """strftime_now for a probe: remembers each format asked for, returns a numbered mark."""

    formats: list[str] = field(default_factory=list)

    def __call__(self, fmt: str) -> str:
        self.formats.append(str(fmt))
        return _MARK.format(len(self.formats) - 1)


def _pattern(text: str) -> str:
    """Regex source for `text`, each date mark a group `d<i>` that matches one line's worth."""
    out, seen, pos = [], set(), 0
    for m in _MARK_RE.finditer(text):
        out.append(re.escape(text[pos : m.start()]))
        i = m.group(1)
        out.append(f"(?P=d{i})" if i in seen else f"(?P<d{i}>[^\n]+?)")
        seen.add(i)
        pos = m.end()
    out.append(re.escape(text[pos:]))
    return "".join(out)


@dataclass(frozen=True)
class Dates:
    """The strings a template's `strftime_now` calls gave, in call order, as read from a text."""

    formats: tuple[str, ...]
    values: tuple[str, ...]

    def strftime_now(self, fallback: datetime | None = None) -> StrftimeNow:
        """A strftime_now that replays the values (later calls: `fallback`, default now)."""
        calls = iter(self.values)

        def now(fmt: str) -> str:
            value = next(calls, None)
            return value if value is not None else (fallback or datetime.now()).strftime(fmt)

        return now

    def when(self) -> datetime | None:
        """A time that formats to every value again, or None (a format strptime cannot invert)."""
        for fmt, value in zip(self.formats, self.values):
            try:
                at = datetime.strptime(value, fmt)
            except ValueError:
                continue
            if all(at.strftime(f) == v for f, v in zip(self.formats, self.values)):
                return at
        return None


def _dates(match: re.Match, formats: Sequence[str]) -> Dates | None:
    values = tuple(match.group(f"d{i}") for i in range(len(formats)) if f"d{i}" in match.re.groupindex)
    if not values or len(values) != len(formats):
        return None
    return Dates(tuple(formats), values)


@dataclass(frozen=True)
class SystemInjection:
    """How a template's system turn reads when the template wrote (part of) it itself."""

    alone: re.Pattern | None  # the whole system text of a chat that has no system message
    alone_formats: tuple[str, ...]
    around: re.Pattern | None  # the system text around a given system message (group "body")
    around_formats: tuple[str, ...]

    @classmethod
    def probe(cls, render: Render, parse: Parse) -> SystemInjection:
        """Render a chat without and with a system message, parse both back, and keep what the
        template added. A template that fails on the probes adds nothing we can undo."""
        user = {"role": "user", "content": _PROBE_USER}
        alone = around = None
        rec_alone, rec_around = _Recorder(), _Recorder()
        try:
            first = parse(render([user], rec_alone))[:1]
            if first and first[0]["role"] == "system":
                alone = re.compile(_pattern(first[0]["content"]))
            first = parse(render([{"role": "system", "content": _PROBE_SYSTEM}, user], rec_around))[:1]
            if first and first[0]["role"] == "system":
                content = first[0]["content"]
                if content.count(_PROBE_SYSTEM) == 1 and content != _PROBE_SYSTEM:
                    head, tail = content.split(_PROBE_SYSTEM)
                    around = re.compile(_pattern(head) + "(?P<body>(?s:.*))" + _pattern(tail))
        except Exception:  # a template is file content: any failure only means no undo
            return cls(None, (), None, ())
        return cls(alone, tuple(rec_alone.formats), around, tuple(rec_around.formats))

    def candidates(self, messages: list[dict]) -> list[tuple[list[dict], Dates | None]]:
        """Readings of `messages` with the template's own system text taken out, each with
        the dates read from it: without the system message when all of it is the
        template's, then with the template's part cut from around the user's."""
        if not messages or messages[0].get("role") != "system":
            return []
        system, rest = messages[0], messages[1:]
        text = str(system.get("content", ""))
        out: list[tuple[list[dict], Dates | None]] = []
        if self.alone is not None:
            m = self.alone.fullmatch(text)
            if m:
                out.append((rest, _dates(m, self.alone_formats)))
        if self.around is not None:
            m = self.around.fullmatch(text)
            if m:
                out.append(([{**system, "content": m.group("body")}] + rest, _dates(m, self.around_formats)))
        return out
