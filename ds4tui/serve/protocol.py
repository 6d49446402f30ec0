"""The OpenAI chat-completions wire format: request checking and response bodies.

Owns: turning a decoded JSON body into a checked `ChatRequest` (every field
typed and bounded, a message the client can act on when not), and building the
response objects (completion, stream chunks, usage, error bodies) as plain
dicts. No HTTP here: serve/app.py does the transport.

Parameters the engine does not implement (`n` > 1, logprobs, images, a forced
`tool_choice`) are refused with a 400 naming them rather than silently ignored;
fields no server acts on (`user`, `metadata`, ...) are accepted and ignored.
Tools: `tools` (function definitions), `tool_choice` "auto" or "none",
assistant messages with `tool_calls` and `tool` messages, passed on in the shape
chat templates read (a call's `arguments` as an object).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ds4tui.chat.stateless import Completion
from ds4tui.errors import Ds4tuiError

MAX_STOP_STRINGS = 4  # OpenAI's own limit
MAX_STOP_CHARS = 256
MAX_MESSAGES = 4096
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_TOOLS = 512
UNSUPPORTED = ("functions", "logprobs", "top_logprobs", "response_format", "logit_bias")
FINISH = {"eos": "stop", "stop-string": "stop", "max-tokens": "length", "context-full": "length",
          "cancelled": "stop"}


class RequestError(Ds4tuiError, ValueError):
    """A request the server will not run: becomes an OpenAI-shaped 4xx."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict:
        return error_body(str(self), kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    stream: bool
    include_usage: bool
    temperature: float | None
    top_p: float | None
    min_p: float | None
    seed: int | None
    max_tokens: int | None
    stop: tuple[str, ...]
    top_k: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    return_progress: bool = False  # llama-server's prompt_progress chunks while prefilling
    tools: tuple[dict, ...] = ()  # function definitions the template renders ("none": left out)
    prompt: str | None = None  # /v1/completions: the text itself, no chat template


def parse_completion_request(body: Any, *, context: int | None = None) -> ChatRequest:
    """A checked /v1/completions request (a plain-text `prompt`), or RequestError."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("prompt must be a non-empty string (one prompt per request)", param="prompt")
    for key in ("suffix", "tools", "tool_choice", "messages"):
        if key in body:
            raise RequestError(f"{key!r} is not supported on /v1/completions", param=key)
    if body.get("echo") not in (None, False):
        raise RequestError("echo is not supported", param="echo")
    if body.get("best_of", 1) != 1:
        raise RequestError("only best_of = 1 is supported", param="best_of")
    checked = parse_chat_request({**body, "messages": [{"role": "user", "content": ""}]}, context=context)
    return dataclasses.replace(checked, messages=[], prompt=prompt)


def parse_chat_request(body: Any, *, context: int | None = None) -> ChatRequest:
    """A checked request, or RequestError naming the offending field. `context`: the
    session's size in tokens, the most max_tokens may ask for."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    # An explicit null is the field left out (the SDKs and many clients send them).
    body = {k: v for k, v in body.items() if v is not None}
    for key in UNSUPPORTED:
        if body.get(key) not in (None, False, [], {}) and not (key == "response_format" and _is_text_format(body[key])):
            raise RequestError(f"{key!r} is not supported by this server", param=key)
    n = body.get("n", 1)  # a null is gone already: absent
    if n != 1 or isinstance(n, bool):
        raise RequestError("only n = 1 is supported", param="n")
    stream = _opt(body, "stream", bool) or False
    options = _opt(body, "stream_options", dict) or {}
    include_usage = options.get("include_usage")
    if include_usage is None:
        include_usage = False
    if not isinstance(include_usage, bool):
        raise RequestError("stream_options.include_usage must be a boolean", param="stream_options")
    max_tokens = _opt(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _opt(body, "max_tokens", int)
    if max_tokens is not None and max_tokens < 1:
        raise RequestError("max_tokens must be at least 1", param="max_tokens")
    if max_tokens is not None and context is not None and max_tokens > context:
        raise RequestError(f"max_tokens {max_tokens} exceeds the context of {context} tokens", param="max_tokens")
    top_k = _opt(body, "top_k", int)
    if top_k is not None and top_k < 0:
        raise RequestError("top_k must be >= 0 (0: off)", param="top_k")
    seed = _opt(body, "seed", int)
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise RequestError("seed must fit in 64 bits", param="seed")
    return ChatRequest(
        messages=_messages(body.get("messages")),
        stream=stream,
        include_usage=include_usage and stream,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0, low_open=True),
        min_p=_number(body, "min_p", 0.0, 1.0, high_open=True),
        seed=seed,
        max_tokens=max_tokens,
        stop=_stops(body.get("stop")),
        top_k=top_k,
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0),
        return_progress=_opt(body, "return_progress", bool) or False,
        tools=_tools(body.get("tools"), body.get("tool_choice")),
    )


def _is_text_format(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "text"


def _opt(body: dict, key: str, kind: type) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RequestError(f"{key} must be {'an integer' if kind is int else 'a ' + kind.__name__}", param=key)
    return value


def _number(body: dict, key: str, low: float, high: float, *, low_open: bool = False,
            high_open: bool = False) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{key} must be a number", param=key)
    value = float(value)
    if not (low < value if low_open else low <= value) or not (value < high if high_open else value <= high):
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise RequestError(f"{key} must be within {bounds}, got {value:g}", param=key)
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise RequestError(f"a stop string may hold at most {MAX_STOP_CHARS} characters", param="stop")
    return tuple(s for s in stops if s)


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list", param="messages")
    if len(value) > MAX_MESSAGES:
        raise RequestError(f"at most {MAX_MESSAGES} messages", param="messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role {role!r} is not supported (system, developer, user, assistant, tool)",
                               param=f"{where}.role")
        msg = {"role": ROLES[role], "content": _content(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise RequestError(f"{where}.tool_call_id must be a string", param=f"{where}.tool_call_id")
            msg["tool_call_id"] = call_id or ""
        if isinstance(m.get("name"), str) and role in ("tool", "assistant", "user"):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _tools(value: Any, choice: Any) -> tuple[dict, ...]:
    """The request's function definitions as templates read them; () when there are none or
    tool_choice is "none"."""
    if choice is not None and choice not in ("auto", "none"):
        # "required" and a named function would need constrained decoding to keep their promise
        raise RequestError("tool_choice may be \"auto\" or \"none\" (this server cannot force a call)",
                           param="tool_choice")
    if value is None or value == [] or choice == "none":
        return ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise RequestError(f"tools must be a list of at most {MAX_TOOLS} function definitions", param="tools")
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise RequestError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", param=where)
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"{where}.function.name must be a non-empty string", param=where)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise RequestError(f"{where}.function.parameters must be a JSON schema object", param=where)
        entry = {"name": fn["name"], "parameters": params}
        if isinstance(fn.get("description"), str):
            entry["description"] = fn["description"]
        out.append({"type": "function", "function": entry})
    return tuple(out)


def _tool_calls(value: Any, where: str) -> list[dict]:
    """An assistant message's calls, `arguments` parsed from OpenAI's JSON text into the object
    templates render (kept as text when it is not JSON)."""
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a list", param=where)
    out = []
    for i, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", "
                               "\"arguments\"}}}}", param=where)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass
        out.append({"id": call.get("id") if isinstance(call.get("id"), str) else f"call_{i}",
                    "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def _content(value: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts (joined); other parts are refused."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content: only text parts are supported", param=f"{where}.content")
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where}.content must be a string or a list of text parts", param=f"{where}.content")


# -- responses ------------------------------------------------------------------------------------


def new_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def usage(c: Completion) -> dict:
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.done.tokens,
        "total_tokens": c.prompt_tokens + c.done.tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
    }


def completion_body(rid: str, model: str, created: int, c: Completion, *, content: str | None = None,
                    reasoning: str = "", tool_calls: list[dict] | None = None) -> dict:
    """content: the reply's text without its reasoning and calls (default: all of it)."""
    message: dict[str, Any] = {"role": "assistant", "content": c.text if content is None else content}
    if reasoning:
        message["reasoning_content"] = reasoning
    finish = FINISH.get(c.done.stop, "stop")
    if tool_calls:
        message["tool_calls"] = tool_calls
        message["content"] = message["content"] or None
        finish = "tool_calls"
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage(c),
    }


def chunk(rid: str, model: str, created: int, *, delta: dict | None = None, finish: str | None = None,
          choices: bool = True, **extra: Any) -> dict:
    """One `chat.completion.chunk`; choices=False gives the usage chunk's empty list."""
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish,
                                         "logprobs": None}] if choices else []}
    body.update(extra)
    return body


def progress(cached: int, total_new: int, done: int, started: float) -> dict:
    """llama-server's `prompt_progress` object: counts include the reused tokens."""
    return {"total": cached + total_new, "cache": cached, "processed": cached + done,
            "time_ms": round((time.perf_counter() - started) * 1000.0, 1)}


def models_body(ids: str | tuple[str, ...], created: int, context: int | None = None) -> dict:
    """The one model served, under its id and then each alias; `max_model_len` (vLLM's name
    for it) is its context in tokens, which a chat client (ds4tui --engine) checks its next
    message against."""
    entries = []
    for model in (ids,) if isinstance(ids, str) else ids:
        entry: dict[str, Any] = {"id": model, "object": "model", "created": created, "owned_by": "ds4tui"}
        if context:
            entry["max_model_len"] = context
        entries.append(entry)
    return {"object": "list", "data": entries}


def text_completion_body(rid: str, model: str, created: int, c: Completion) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": c.text, "finish_reason": FINISH.get(c.done.stop, "stop"),
                         "logprobs": None}],
            "usage": usage(c)}


def text_chunk(rid: str, model: str, created: int, *, text: str = "", finish: str | None = None,
               choices: bool = True, **extra: Any) -> dict:
    """One streamed /v1/completions object (the same `text_completion` type, as OpenAI sends)."""
    body: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model,
                            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]
                            if choices else []}
    body.update(extra)
    return body
