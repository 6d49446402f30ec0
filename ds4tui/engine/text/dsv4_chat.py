"""The DeepSeek V4 chat format: render messages to the exact prompt text ds4 renders, and parse it back.

Owns the text layout of ds4-server's `render_chat_prompt_text` (antirez/ds4), byte for byte:

    <｜begin▁of▁sentence｜>{tools section}{system}<｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>
    <｜User｜>{user}<｜Assistant｜></think>            <- generation prompt, thinking off
    <｜User｜>{user}<｜Assistant｜><think>             <- generation prompt, thinking on

- System (and developer) messages are joined with a blank line, after the tools section
  when there are tools (ds4's `## Tools` preamble, then the functions' JSON one per line).
- Thinking: off, every assistant turn opens with `</think>` (its reasoning is not rendered).
  On, the turns before the last user message do too (V4 drops old reasoning), and the ones
  after it render `<think>{reasoning}</think>`; in a tool context (tools, a tool call or a
  tool result anywhere) every turn keeps its reasoning. `think_max` puts ds4's Think Max
  instruction right after BOS (ds4 does so only with a context of 384K tokens or more).
- Tool calls follow the answer as DSML: `\\n\\n<｜DSML｜tool_calls>`, one `invoke` per
  call with one `parameter` per argument (`string="true"` and the raw text for strings,
  `string="false"` and minified JSON otherwise; arguments that are not a JSON object are one
  string parameter `arguments`), then `</｜DSML｜tool_calls>`, escaped as ds4 escapes them.
- Tool results are user turns: `<｜User｜><tool_result>{text}</tool_result>`, consecutive
  results sharing one `<｜User｜>`.
- An assistant message right after another one gets no `<｜Assistant｜>` of its own.

`parse` inverts `render` (for text rendered in the same thinking mode): tool results and
DSML calls come back as `tool` messages and `tool_calls`; the tools section stays in the
system message's text (rendering it again reproduces it). `parse_dsml_calls` reads the
calls a reply wrote. The file's jinja template is not run (ds4 does not run it either).
Tokenization is the generic `HFTokenizer` (engine/text/hf_tokenizer.py): the special
tokens below are registered in tokenizer.json, so they map to single ids.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"  # the tool-call markup token of V4
# In this order the tiny tokenizer gives BOS id 0 and EOS id 1, as the real vocabulary does.
SPECIAL_TOKENS = (BOS, EOS, PAD, USER, ASSISTANT, THINK, THINK_END, DSML)

CALLS_OPEN, CALLS_CLOSE = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"
INVOKE_CLOSE, PARAM_CLOSE = f"</{DSML}invoke>", f"</{DSML}parameter>"
RESULT_OPEN, RESULT_CLOSE = "<tool_result>", "</tool_result>"
CALLS_LEAD = f"\n\n{CALLS_OPEN}\n"  # what ds4 writes between an answer and its calls

# ds4.c's DS4_REASONING_EFFORT_MAX_PREFIX (Think Max).
THINK_MAX_PREFIX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)

TOOLS_HEADER = "## Tools\n\n"
# ds4_server.c's append_tools_prompt_text: the instructions around the schemas.
TOOLS_PREAMBLE = (
    TOOLS_HEADER
    + "You have access to a set of tools to help answer the user question. "
    f"You can invoke tools by writing a \"{CALLS_OPEN}\" block like the following:\n\n"
    f"{CALLS_OPEN}\n"
    f"<{DSML}invoke name=\"$TOOL_NAME\">\n"
    f"<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE{PARAM_CLOSE}\n"
    "...\n"
    f"{INVOKE_CLOSE}\n"
    f"<{DSML}invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    f"{INVOKE_CLOSE}\n"
    f"{CALLS_CLOSE}\n\n"
    "String parameters should be specified as raw text and set `string=\"true\"`. "
    "Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with "
    "XML or HTML entity escapes. "
    f"Only if a string value itself contains the exact closing parameter tag `{PARAM_CLOSE}`, write that tag as "
    f"`&lt;/{DSML}parameter>` inside the value. "
    "For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
TOOLS_CLOSING = ("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
                 "calls. Use the exact parameter names from the schemas.")


class Dsv4ChatTemplate:
    """The `ChatTemplate` protocol for DeepSeek V4, rendering what ds4-server renders."""

    stop_strings: tuple[str, ...] = (EOS,)
    # What the reply parsers read a template's tool syntax from (reply_parts.syntax_of): this
    # template is code, not jinja; its tools section is the text that names the syntax.
    source = TOOLS_PREAMBLE

    def __init__(self, default_system_prompt: str | None = None, thinking: bool = False,
                 think_max: bool = False) -> None:
        self.default_system_prompt = default_system_prompt
        self.thinking = thinking
        self.think_max = think_max and thinking

    # -- rendering ----------------------------------------------------------------------

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True, *, now=None,
               tools: Sequence[dict] | None = None) -> str:
        """now: unused (V4's layout writes no date); tools: OpenAI function definitions
        ({"type": "function", "function": {...}} or the function objects themselves)."""
        systems = [m.get("content") or "" for m in messages if m["role"] in ("system", "developer")]
        if not systems and self.default_system_prompt:
            systems = [self.default_system_prompt]
        system = "\n\n".join(([tools_section(tools)] if tools else []) + systems)
        tool_context = bool(tools) or system.startswith(TOOLS_PREAMBLE) or any(
            m["role"] == "tool" or (m["role"] == "assistant" and m.get("tool_calls")) for m in messages)
        last_user = max((i for i, m in enumerate(messages) if m["role"] in ("user", "tool")), default=-1)
        parts = [BOS, THINK_MAX_PREFIX if self.think_max else "", system]
        pending_assistant = pending_result = False
        for i, m in enumerate(messages):
            role = m["role"]
            if role in ("system", "developer"):
                continue
            if role == "user":
                parts += [USER, m.get("content") or ""]
                pending_assistant, pending_result = True, False
            elif role == "tool":
                if not pending_result:
                    parts.append(USER)
                parts += [RESULT_OPEN, _escape_close(m.get("content") or "", RESULT_CLOSE, "&lt;"), RESULT_CLOSE]
                pending_assistant = pending_result = True
            elif role == "assistant":
                if pending_assistant:
                    keep = self.thinking and (tool_context or i > last_user)
                    parts += [ASSISTANT, f"{THINK}{m.get('reasoning') or ''}{THINK_END}" if keep else THINK_END]
                parts += [m.get("content") or "", dsml_calls(m.get("tool_calls") or ()), EOS]
                pending_assistant = pending_result = False
            else:
                raise ValueError(f"role {role!r} is not supported by the DeepSeek V4 template")
        if add_generation_prompt and pending_assistant:
            parts += [ASSISTANT, THINK if self.thinking else THINK_END]
        return "".join(parts)

    def written_on(self, text: str) -> None:
        return None

    # -- parsing ------------------------------------------------------------------------

    def parse(self, text: str) -> list[dict]:
        """Messages of a rendered transcript. A trailing open assistant turn (no end of
        sentence) is returned with what it has so far; an empty generation prompt is not."""
        if not text.startswith(BOS):
            raise ValueError("not a DeepSeek V4 transcript: no begin-of-sentence token")
        pos = len(BOS)
        if text.startswith(THINK_MAX_PREFIX, pos):
            pos += len(THINK_MAX_PREFIX)
        out: list[dict] = []
        end = _next_marker(text, pos)
        if end > pos:
            out.append({"role": "system", "content": text[pos:end]})
        pos = end
        after_eos = False
        while pos < len(text):
            if text.startswith(USER, pos):
                start = pos + len(USER)
                pos = _next_marker(text, start)
                results = _tool_results(text[start:pos])
                out += results if results is not None else [{"role": "user", "content": text[start:pos]}]
                after_eos = False
                continue
            msg: dict = {"role": "assistant"}
            if text.startswith(ASSISTANT, pos):
                pos += len(ASSISTANT)
                if text.startswith(THINK, pos):
                    close = text.find(THINK_END, pos)
                    if close < 0:  # still thinking: an open turn
                        if text[pos + len(THINK):]:
                            out.append({**msg, "reasoning": text[pos + len(THINK):], "content": ""})
                        break
                    msg["reasoning"] = text[pos + len(THINK): close]
                    pos = close + len(THINK_END)
                elif text.startswith(THINK_END, pos):
                    pos += len(THINK_END)
            elif not after_eos:
                raise ValueError(f"unexpected text at offset {pos}")
            stop = text.find(EOS, pos)
            body = text[pos:] if stop < 0 else text[pos:stop]
            content, calls = _split_calls(body)
            msg["content"] = content
            if calls is not None:
                msg["tool_calls"] = calls
            if stop < 0:
                if body or msg.get("reasoning"):
                    out.append(msg)
                break
            out.append(msg)
            pos = stop + len(EOS)
            after_eos = True  # another assistant message may follow without its marker
        return out


# -- the pieces ds4 writes -----------------------------------------------------------------------


def tools_section(tools: Sequence[dict]) -> str:
    """ds4's tools preamble with each function's JSON on its own line (compact, as the OpenAI
    client sends it: ds4-server copies the request's bytes)."""
    schemas = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False, separators=(",", ":")) for t in tools)
    return TOOLS_PREAMBLE + schemas + TOOLS_CLOSING


def dsml_calls(calls: Sequence[dict]) -> str:
    """An assistant turn's calls as ds4 writes them after the answer ('' for none). A call is
    OpenAI's {"function": {"name", "arguments"}} (arguments a JSON text or an object)."""
    if not calls:
        return ""
    out = [CALLS_LEAD]
    for call in calls:
        fn = call.get("function", call)
        out.append(f"<{DSML}invoke name=\"{_escape_attr(fn.get('name') or '')}\">\n")
        params = _arguments(fn.get("arguments"))
        if params is None:  # not a JSON object: the raw text as one string parameter
            raw = fn.get("arguments")
            params = [("arguments", True, raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False))]
        for key, is_string, value in params:
            body = (_escape_close(value, PARAM_CLOSE, "&lt;") if is_string
                    else _escape_close(value, PARAM_CLOSE, "\\u003c"))
            out.append(f"<{DSML}parameter name=\"{_escape_attr(key)}\" string=\"{'true' if is_string else 'false'}\">"
                       f"{body}{PARAM_CLOSE}\n")
        out.append(f"{INVOKE_CLOSE}\n")
    out.append(CALLS_CLOSE)
    return "".join(out)


def _arguments(args: Any) -> list[tuple[str, bool, str]] | None:
    """(name, is_string, text) per argument, in order; None when args is not a JSON object.
    A JSON text is scanned as ds4 scans it: strings decoded, other values kept as written with
    the whitespace outside strings removed."""
    if isinstance(args, dict):
        return [(str(k), isinstance(v, str), v if isinstance(v, str) else
                 json.dumps(v, ensure_ascii=False, separators=(",", ":"))) for k, v in args.items()]
    if not isinstance(args, str):
        return None
    dec, text, out = json.JSONDecoder(), args, []
    i = _skip_ws(text, 0)
    if not text.startswith("{", i):
        return None
    i = _skip_ws(text, i + 1)
    try:
        while i < len(text) and text[i] != "}":
            key, i = dec.raw_decode(text, i)
            i = _skip_ws(text, i)
            if not isinstance(key, str) or not text.startswith(":", i):
                return None
            i = _skip_ws(text, i + 1)
            start = i
            value, i = dec.raw_decode(text, i)
            if isinstance(value, str):
                out.append((key, True, value))
            else:
                out.append((key, False, _minify(text[start:i])))
            i = _skip_ws(text, i)
            if text.startswith(",", i):
                i = _skip_ws(text, i + 1)
    except ValueError:
        return None
    return out if text.startswith("}", i) else None


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _minify(raw: str) -> str:
    out, in_string, escape = [], False, False
    for c in raw:
        if in_string:
            out.append(c)
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif not c.isspace():
            out.append(c)
    return "".join(out)


def _escape_attr(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _unescape_attr(s: str) -> str:
    return s.replace("&quot;", '"').replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&")


def _escape_close(s: str, tag: str, lt: str) -> str:
    """ds4's guard of a closing tag inside a value: its '<' written as `lt`."""
    return s.replace(tag, lt + tag[1:])


# -- reading it back -------------------------------------------------------------------------------

_INVOKE = re.compile(rf'<{DSML}invoke name="([^"]*)">\n(.*?){re.escape(INVOKE_CLOSE)}\n', re.S)
_PARAM = re.compile(rf'<{DSML}parameter name="([^"]*)" string="(true|false)">(.*?){re.escape(PARAM_CLOSE)}\n', re.S)


def parse_dsml_calls(block: str) -> list[dict] | None:
    """The calls of one `<｜DSML｜tool_calls>...</｜DSML｜tool_calls>` block (nothing around it),
    as OpenAI tool calls whose arguments are JSON text; None when it is not such a block."""
    if not (block.startswith(CALLS_OPEN + "\n") and block.endswith(CALLS_CLOSE)):
        return None
    inner, pos, calls = block[len(CALLS_OPEN) + 1: len(block) - len(CALLS_CLOSE)], 0, []
    while pos < len(inner):
        m = _INVOKE.match(inner, pos)
        if m is None:
            return None
        params, ppos, body = [], 0, m.group(2)
        while ppos < len(body):
            p = _PARAM.match(body, ppos)
            if p is None:
                return None
            key, is_string, value = _unescape_attr(p.group(1)), p.group(2) == "true", p.group(3)
            if is_string:
                params.append(json.dumps(key, ensure_ascii=False) + ":" + json.dumps(
                    value.replace("&lt;" + PARAM_CLOSE[1:], PARAM_CLOSE), ensure_ascii=False))
            else:
                params.append(json.dumps(key, ensure_ascii=False) + ":" + value.replace("\\u003c" + PARAM_CLOSE[1:],
                                                                                     PARAM_CLOSE))
            ppos = p.end()
        calls.append({"type": "function",
                      "function": {"name": _unescape_attr(m.group(1)), "arguments": "{" + ",".join(params) + "}"}})
        pos = m.end()
    return calls


def _split_calls(body: str) -> tuple[str, list[dict] | None]:
    """An assistant body's answer and its DSML calls (None: the body has none)."""
    at = body.rfind(CALLS_LEAD)
    if at < 0:
        return body, None
    calls = parse_dsml_calls(body[at + 2:])
    return (body, None) if calls is None else (body[:at], calls)


def _tool_results(turn: str) -> list[dict] | None:
    """A user turn that is only tool results, as tool messages; None when it is not one."""
    if not turn.startswith(RESULT_OPEN):
        return None
    out, pos = [], 0
    while pos < len(turn):
        if not turn.startswith(RESULT_OPEN, pos):
            return None
        close = turn.find(RESULT_CLOSE, pos + len(RESULT_OPEN))
        if close < 0:
            return None
        text = turn[pos + len(RESULT_OPEN): close].replace("&lt;" + RESULT_CLOSE[1:], RESULT_CLOSE)
        out.append({"role": "tool", "content": text})
        pos = close + len(RESULT_CLOSE)
    return out


def _next_marker(text: str, pos: int) -> int:
    """Offset of the next turn marker (user or assistant) at or after pos, else len(text)."""
    hits = [i for i in (text.find(USER, pos), text.find(ASSISTANT, pos)) if i >= 0]
    return min(hits) if hits else len(text)
