"""Tool calls and reasoning in replies: which syntax a chat template speaks, and the model's
text back into OpenAI's `content`, `reasoning_content` and `tool_calls`.

Owns:
- `syntax_of(template source)`: the tool-call syntax a model's own template renders (and so
  the one the model was trained to write): `hermes` (`<tool_call>{"name", "arguments"}
  </tool_call>`: Qwen 2.5, Qwen 3 and the many templates that copied it), `llama3` (a reply
  that is one JSON object `{"name", "parameters"}`, optionally after `<|python_tag|>`:
  Llama 3.1 to 3.3), `deepseek` (`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` and a
  fenced JSON block: DeepSeek V3 and R1), `dsml` (`<｜DSML｜tool_calls>` with one `invoke` per
  call and one `parameter` per argument: DeepSeek V4, as ds4 renders it). None: the template
  renders no tools.
- `ReplyParser`: the reply's text, fed as it streams, split into reasoning (a `<think>`
  block at its start, or from the start when the prompt opened one) and content, released
  as soon as it cannot be the start of a tool call, and the calls themselves, parsed when
  the reply is whole. Text that looked like a call and does not parse is content: nothing
  the model wrote is lost.
- `opens_think(template)`: whether the template's generation prompt opens a think block.
Used by `ds4tui serve` (the response bodies are serve/protocol.py's) and by the chat, which
shows the reasoning folded and the calls as blocks (chat/reply_view.py). Leaves to the chat
template the rendering.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ds4tui.engine.text.dsv4_chat import CALLS_CLOSE, CALLS_OPEN, parse_dsml_calls

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
HERMES_OPEN = "<tool_call>"
PYTHON_TAG = "<|python_tag|>"
DEEPSEEK_OPEN = "<｜tool▁calls▁begin｜>"
DSML_OPEN, DSML_CLOSE = CALLS_OPEN, CALLS_CLOSE  # DeepSeek V4 (engine/text/dsv4_chat.py)

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_DEEPSEEK_CALL = re.compile(
    r"<｜tool▁call▁begin｜>\s*(?:function)?\s*<｜tool▁sep｜>\s*([^\n<]+?)\s*\n\s*```(?:json)?\s*(.*?)\s*```\s*"
    r"(?:<｜tool▁call▁end｜>|$)", re.S)


def syntax_of(source: str | None) -> str | None:
    """The tool-call syntax of a chat template's source, None when it renders no tools."""
    if not source or "tools" not in source:
        return None
    if DSML_OPEN in source:
        return "dsml"
    if HERMES_OPEN in source:
        return "hermes"
    if "tool▁calls▁begin" in source:
        return "deepseek"
    if "<|start_header_id|>" in source and '"parameters": ' in source:
        return "llama3"
    return None


def opens_think(template) -> bool:
    """Whether `template`'s generation prompt ends inside an open think block (DeepSeek R1, some
    Qwen 3 modes, DeepSeek V4 with thinking on): the reply then starts as reasoning."""
    try:
        prompt = template.render([{"role": "user", "content": "x"}], add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that refuses a bare user turn: no think block
        return False
    return isinstance(prompt, str) and prompt.rstrip().endswith(THINK_OPEN)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI's `function.arguments`
    id: str

    def body(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call(name: object, arguments: object) -> ToolCall | None:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False), "call_" + uuid.uuid4().hex[:24])


def _json_objects(text: str) -> list[object] | None:
    """The JSON values `text` holds one after another (separated by whitespace or `;`), or None."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and (text[i].isspace() or text[i] == ";"):
            i += 1
        if i == len(text):
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)


def parse_calls(syntax: str, text: str) -> list[ToolCall] | None:
    """The calls in `text` (from the first call marker on), None when it is not calls."""
    calls: list[ToolCall | None] = []
    if syntax == "hermes":
        for body in _HERMES_CALL.findall(text):
            objs = _json_objects(body)
            if not objs or len(objs) != 1 or not isinstance(objs[0], dict):
                return None
            calls.append(_call(objs[0].get("name"), objs[0].get("arguments", objs[0].get("parameters"))))
    elif syntax == "llama3":
        objs = _json_objects(text.strip().removeprefix(PYTHON_TAG))
        if not objs:
            return None
        for obj in objs:
            if not isinstance(obj, dict):
                return None
            calls.append(_call(obj.get("name"), obj.get("parameters", obj.get("arguments"))))
    elif syntax == "deepseek":
        for name, args in _DEEPSEEK_CALL.findall(text):
            calls.append(_call(name, args))
    elif syntax == "dsml":
        block = text.strip()
        parsed = parse_dsml_calls(block) if block.endswith(DSML_CLOSE) else None
        for c in parsed or ():
            calls.append(_call(c["function"]["name"], c["function"]["arguments"]))
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (it may still become one)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ReplyParser:
    """Feed the reply's text as it comes; get (kind, text) pieces, kind "reasoning" or
    "content"; `finish` releases the rest and parses the held calls (`calls`).

    syntax: the template's tool-call syntax, or None (no tools in this request: calls are
    not looked for). in_think: the prompt ended inside an open `<think>` block.
    """

    def __init__(self, syntax: str | None, in_think: bool = False) -> None:
        self.syntax = syntax
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._pos = 0
        self._mode = "think" if in_think else "start"
        self._call_from: int | None = None
        self._content_started = False
        self._after_think = False  # the whitespace after a think block is not content

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buf += text
        return self._advance(final=False)

    def finish(self) -> list[tuple[str, str]]:
        out = self._advance(final=True)
        if self._call_from is not None:
            held = self._buf[self._call_from:]
            calls = parse_calls(self.syntax, held) if self.syntax else None
            if calls:
                self.calls = calls
            elif held:
                out.append(("content", held))
        return [(k, t) for k, t in out if t]

    def _advance(self, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf = self._buf
        while True:
            rest = buf[self._pos:]
            if self._mode == "start":
                head = rest.lstrip()
                if head.startswith(THINK_OPEN):
                    self._pos += len(rest) - len(head) + len(THINK_OPEN)
                    self._mode = "think"
                    continue
                if not final and THINK_OPEN.startswith(head):
                    return out  # may still open a think block
                self._mode = "content"
                continue
            if self._mode == "think":
                i = buf.find(THINK_CLOSE, self._pos)
                if i >= 0:
                    out.append(("reasoning", buf[self._pos:i]))
                    self._pos = i + len(THINK_CLOSE)
                    self._mode = "content"
                    self._after_think = True
                    continue
                end = len(buf) if final else len(buf) - _partial_suffix(buf, THINK_CLOSE)
                out.append(("reasoning", buf[self._pos:end]))
                self._pos = end
                return out
            if self._mode == "call":
                return out  # held until finish
            # content
            if not self._content_started:
                head = rest.lstrip()
                if not head and not final:
                    return out  # leading whitespace waits for what follows
                if self._after_think:
                    self._pos += len(rest) - len(head)
                if self.syntax == "llama3":
                    if head.startswith("{") or head.startswith(PYTHON_TAG):
                        self._call_from, self._mode = self._pos, "call"
                        continue
                    if not final and PYTHON_TAG.startswith(head):
                        return out
                self._content_started = bool(head) or final
            marker = {"hermes": HERMES_OPEN, "deepseek": DEEPSEEK_OPEN, "dsml": DSML_OPEN}.get(self.syntax or "")
            end = len(buf)
            if marker:
                i = buf.find(marker, self._pos)
                if i >= 0:
                    out.append(("content", buf[self._pos:i]))
                    self._pos = self._call_from = i
                    self._mode = "call"
                    continue
                if not final:
                    end -= _partial_suffix(buf, marker)
            out.append(("content", buf[self._pos:end]))
            self._pos = end
            return out
