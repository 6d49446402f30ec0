"""Chat templates: a model's own jinja template, rendered in a sandbox, and the turn formats
of the families we know (to parse a transcript back, and for files that carry no template).

Owns:
- `TurnFormat`: one family's turn layout (ChatML, Gemma, Llama 3): its stop strings, how
  a transcript splits back into messages, and a plain rendering used when a model file has
  no template (the Gemma 3 270M GGUF is a base model: it has none).
- `JinjaChatTemplate`: the `ChatTemplate` protocol over a `tokenizer.chat_template`, rendered
  with jinja2's ImmutableSandboxedEnvironment (what transformers uses: a template is file
  content, never trusted code), parsed back with the family's `TurnFormat` into the messages
  that render the same text again (what the template wrote by itself taken out, see
  template_probe.py). `strftime_now` gives the chat's own time, not the clock's, so a chat
  renders the same date on every turn and when resumed another day.
- `chat_template_for(...)`: which of the two a model gets, and a line for the model info.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Sequence

from ds4tui.engine.errors import WeightsError
from ds4tui.engine.text.hf_tokenizer import IM_END, IM_START, ChatMLTemplate, default_system_from_template
from ds4tui.engine.text.prefix import common_prefix
from ds4tui.engine.text.template_probe import Dates, StrftimeNow, SystemInjection


@dataclass(frozen=True)
class TurnFormat:
    name: str
    stop_strings: tuple[str, ...]
    marker: str  # a string only this family's templates and vocabularies contain
    render_plain: Callable[[Sequence[dict], bool, str], str]
    parse: Callable[[str], list[dict]]


def _gemma_render(messages: Sequence[dict], add_generation_prompt: bool, bos: str) -> str:
    """Gemma's turns: a system message becomes the head of the first user turn; the
    assistant's role is `model`; contents are stripped."""
    out = [bos]
    prefix = ""
    msgs = list(messages)
    if msgs and msgs[0]["role"] == "system":
        prefix, msgs = msgs[0]["content"].strip() + "\n\n", msgs[1:]
    for i, m in enumerate(msgs):
        role = "model" if m["role"] == "assistant" else m["role"]
        out.append(f"<start_of_turn>{role}\n{prefix if i == 0 else ''}{m['content'].strip()}<end_of_turn>\n")
    if add_generation_prompt:
        out.append("<start_of_turn>model\n")
    return "".join(out)


_GEMMA_TURN = re.compile(r"<start_of_turn>(\w+)\n(.*?)(?:<end_of_turn>\n?|$)", re.S)


def _gemma_parse(text: str) -> list[dict]:
    """Turns of a Gemma transcript (a system message folded into the first user turn comes
    back as part of it: rendering the result gives the same text)."""
    out = []
    for role, content in _GEMMA_TURN.findall(text):
        if content or text.rstrip().endswith("<end_of_turn>"):
            out.append({"role": "assistant" if role == "model" else role, "content": content})
    if out and not out[-1]["content"] and text.endswith("<start_of_turn>model\n"):
        out.pop()  # the generation prompt
    return out


def _llama3_render(messages: Sequence[dict], add_generation_prompt: bool, bos: str) -> str:
    out = [bos]
    for m in messages:
        out.append(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>")
    if add_generation_prompt:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


_LLAMA3_TURN = re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|$)", re.S)


def _llama3_parse(text: str) -> list[dict]:
    out = [{"role": r, "content": c} for r, c in _LLAMA3_TURN.findall(text)]
    if out and not out[-1]["content"] and not text.endswith("<|eot_id|>"):
        out.pop()  # the generation prompt
    return out


def _chatml_render(messages: Sequence[dict], add_generation_prompt: bool, bos: str) -> str:
    return ChatMLTemplate(None).render(messages, add_generation_prompt)


TURN_FORMATS = {
    "chatml": TurnFormat("chatml", (IM_END, "<|endoftext|>"), IM_START, _chatml_render,
                         lambda text: ChatMLTemplate(None).parse(text)),
    "gemma": TurnFormat("gemma", ("<end_of_turn>", "<eos>"), "<start_of_turn>", _gemma_render, _gemma_parse),
    "llama3": TurnFormat("llama3", ("<|eot_id|>", "<|end_of_text|>"), "<|start_header_id|>", _llama3_render,
                         _llama3_parse),
}


def format_of(template: str | None, vocab_has: Callable[[str], bool], arch: str) -> TurnFormat | None:
    """The family's turn format: named by the template's markers, else by the vocabulary's
    tokens, else by the architecture (Gemma)."""
    for fmt in TURN_FORMATS.values():
        if template and fmt.marker in template:
            return fmt
    if template:
        return None
    if arch == "gemma3":
        return TURN_FORMATS["gemma"]
    for fmt in TURN_FORMATS.values():
        if vocab_has(fmt.marker):
            return fmt
    return None


def _raise(message: str):
    raise ValueError(f"chat template: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' `tojson` (templates are written against it): plain json.dumps, where
    jinja's own escapes <, >, & and ' for HTML (a tool's description would not read as the
    model saw it in training)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class JinjaChatTemplate:
    """The `ChatTemplate` protocol over a model's own jinja template."""

    def __init__(self, template: str, fmt: TurnFormat, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2.exceptions import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(template)
        except TemplateError as exc:
            raise WeightsError(f"the model's chat template does not parse ({exc})") from None
        self.source = template
        self.format = fmt
        self.stop_strings = fmt.stop_strings
        self._tokens = {"bos_token": bos_token, "eos_token": eos_token}
        self.default_system_prompt = default_system_from_template(template) if fmt.name == "chatml" else None
        self._injection: SystemInjection | None = None  # probed on the first parse

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True, *,
               now: datetime | None = None, tools: Sequence[dict] | None = None) -> str:
        """now: what the template's `strftime_now` formats (a chat passes its own time; None: the
        clock). tools: OpenAI-style tool definitions, for the templates that render them (the
        server's requests; messages may then carry `tool_calls` and `tool` turns)."""
        return self._render(messages, add_generation_prompt, lambda fmt: (now or datetime.now()).strftime(fmt),
                            list(tools) if tools else None)

    def _render(self, messages: Sequence[dict], add_generation_prompt: bool, strftime_now: StrftimeNow,
                tools: list[dict] | None = None) -> str:
        # strftime_now goes in per render (a context value hides a global): each chat has its own date.
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                     tools=tools, strftime_now=strftime_now, **self._tokens)

    def parse(self, text: str) -> list[dict]:
        return self.read(text)[0]

    def written_on(self, text: str) -> datetime | None:
        """The time the template wrote into `text` through strftime_now, when it wrote one."""
        return self.read(text)[1]

    def read(self, text: str) -> tuple[list[dict], datetime | None]:
        """The messages whose rendering reproduces `text`, and the time its dates say.

        The family's parse reads every turn as written; when the template wrote a system turn
        (or part of one) by itself, rendering that reading doubles it. Then the readings with
        the template's part taken out are tried, and the one whose rendering agrees with the
        most of `text` wins (the plain reading on a tie).
        """
        messages = self.format.parse(text)
        if self._injection is None:
            self._injection = SystemInjection.probe(lambda m, f: self._render(m, False, f), self.format.parse)
        candidates = self._injection.candidates(messages)
        dates = next((d for _, d in candidates if d is not None), None)
        best, best_dates = messages, dates
        agreed = self._agreement(messages, text, dates)
        for candidate, cand_dates in candidates:
            if agreed == len(text):
                break
            n = self._agreement(candidate, text, cand_dates)
            if n > agreed:
                best, best_dates, agreed = candidate, cand_dates, n
        return best, best_dates.when() if best_dates is not None else None

    def _agreement(self, messages: list[dict], text: str, dates: Dates | None) -> int:
        """How many leading characters of `text` the rendering of `messages` reproduces (a
        transcript may end inside its last message or with a generation prompt)."""
        best = 0
        for generation in (False, True):
            strftime_now = dates.strftime_now() if dates is not None else lambda f: datetime.now().strftime(f)
            try:
                rendered = self._render(messages, generation, strftime_now)
            except Exception:  # a reading the template refuses (e.g. roles out of order)
                continue
            best = max(best, common_prefix(rendered, text))
        return best


class TurnFormatTemplate:
    """The `ChatTemplate` protocol from a family's turn format alone (no template in the file)."""

    default_system_prompt = None

    def __init__(self, fmt: TurnFormat, bos_token: str = "") -> None:
        self.format = fmt
        self.stop_strings = fmt.stop_strings
        self._bos = bos_token

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True, *,
               now: datetime | None = None) -> str:
        return self.format.render_plain(messages, add_generation_prompt, self._bos)

    def parse(self, text: str) -> list[dict]:
        return self.format.parse(text)

    def written_on(self, text: str) -> datetime | None:
        return None  # the built-in turns write no date


def chat_template_for(template: str | None, vocab_has: Callable[[str], bool], arch: str,
                      bos_token: str = "", eos_token: str = "", source: str = "model"):
    """(ChatTemplate, a line for the model info). WeightsError when there is neither a template
    nor a turn format we know for this model."""
    fmt = format_of(template, vocab_has, arch)
    if template:
        if fmt is None:
            fmt = TURN_FORMATS["chatml"] if IM_END in template else None
        if fmt is None:
            raise WeightsError(f"{source}: its chat template uses a turn format this app cannot parse back "
                               f"(known: {', '.join(TURN_FORMATS)})")
        return JinjaChatTemplate(template, fmt, bos_token, eos_token), f"{fmt.name} (the model's own template)"
    if fmt is None:
        raise WeightsError(f"{source}: no chat template and no known turn format ({', '.join(TURN_FORMATS)})")
    if fmt.name == "chatml":
        return ChatMLTemplate(None), "chatml (built in: the file has no template)"
    return TurnFormatTemplate(fmt, bos_token), f"{fmt.name} turns (built in: the file has no template)"
