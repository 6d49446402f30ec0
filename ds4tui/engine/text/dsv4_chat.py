"""The DeepSeek V4 chat format: render messages to the exact prompt text, and parse it back.

Owns the text layout ds4's server renders (`render_chat_prompt_text`):

    <｜begin▁of▁sentence｜>{system}<｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>
    <｜User｜>{user}<｜Assistant｜></think>            <- generation prompt (thinking off)

System messages are joined with a blank line at the top. An assistant turn with
a `reasoning` field renders it as `<think>{reasoning}</think>` before the
answer; without one, the turn opens with `</think>` (thinking closed), as ds4
does for non-thinking turns. With `thinking=True` the generation prompt ends in
`<think>` instead. Unlike ds4, every assistant message gets its own
`<｜Assistant｜>` marker (ds4 omits it for a second consecutive assistant
message), so `parse` can invert `render`. Tool turns are not supported.
Tokenization is the generic `HFTokenizer` (engine/text/hf_tokenizer.py): the special
tokens below are registered in tokenizer.json, so they map to single ids.
"""

from __future__ import annotations

from typing import Sequence

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


class Dsv4ChatTemplate:
    """The `ChatTemplate` protocol for DeepSeek V4."""

    stop_strings: tuple[str, ...] = (EOS,)

    def __init__(self, default_system_prompt: str | None = None, thinking: bool = False) -> None:
        self.default_system_prompt = default_system_prompt
        self.thinking = thinking

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True, *, now=None) -> str:
        """now: unused (V4's layout writes no date); the ChatTemplate protocol passes it."""
        systems = [m["content"] for m in messages if m["role"] == "system"]
        system = "\n\n".join(systems) if systems else (self.default_system_prompt or "")
        parts = [BOS, system]
        for m in messages:
            role = m["role"]
            if role == "system":
                continue
            if role == "user":
                parts += [USER, m["content"]]
            elif role == "assistant":
                reasoning = m.get("reasoning")
                head = f"{THINK}{reasoning}{THINK_END}" if reasoning else THINK_END
                parts += [ASSISTANT, head, m["content"], EOS]
            else:
                raise ValueError(f"role {role!r} is not supported by the DeepSeek V4 template")
        if add_generation_prompt:
            parts += [ASSISTANT, THINK if self.thinking else THINK_END]
        return "".join(parts)

    def written_on(self, text: str) -> None:
        return None

    def parse(self, text: str) -> list[dict]:
        """Messages of a rendered transcript. A trailing open assistant turn (no end of
        sentence) is returned with what it has so far; an empty generation prompt is not."""
        if not text.startswith(BOS):
            raise ValueError("not a DeepSeek V4 transcript: no begin-of-sentence token")
        pos = len(BOS)
        out: list[dict] = []
        end = _next_marker(text, pos)
        if end > pos:
            out.append({"role": "system", "content": text[pos:end]})
        pos = end
        while pos < len(text):
            if text.startswith(USER, pos):
                start = pos + len(USER)
                pos = _next_marker(text, start)
                out.append({"role": "user", "content": text[start:pos]})
                continue
            if not text.startswith(ASSISTANT, pos):
                raise ValueError(f"unexpected text at offset {pos}")
            pos += len(ASSISTANT)
            msg: dict = {"role": "assistant"}
            if text.startswith(THINK, pos):
                close = text.find(THINK_END, pos)
                if close < 0:  # still thinking: an open turn
                    if text[pos + len(THINK) :]:
                        out.append({**msg, "reasoning": text[pos + len(THINK) :], "content": ""})
                    break
                msg["reasoning"] = text[pos + len(THINK) : close]
                pos = close + len(THINK_END)
            elif text.startswith(THINK_END, pos):
                pos += len(THINK_END)
            stop = text.find(EOS, pos)
            if stop < 0:
                if text[pos:] or msg.get("reasoning"):
                    out.append({**msg, "content": text[pos:]})
                break
            out.append({**msg, "content": text[pos:stop]})
            pos = stop + len(EOS)
        return out


def _next_marker(text: str, pos: int) -> int:
    """Offset of the next turn marker (user or assistant) at or after pos, else len(text)."""
    hits = [i for i in (text.find(USER, pos), text.find(ASSISTANT, pos)) if i >= 0]
    return min(hits) if hits else len(text)
