"""A stored transcript read back as messages, whatever template wrote it (ChatML, DeepSeek V4,
Gemma and Llama 3 turns).

Owns: choosing the template by the text's first marker and parsing with that
template's own `parse`, so a file's text reads back exactly as the chat that
wrote it would. For the cache browser, which has no model loaded (`ds4tui
browse`) yet shows every file as messages and names untitled files by their
first user message. Needs no torch.
"""

from __future__ import annotations

from ds4tui.engine.text.chat_templates import TURN_FORMATS
from ds4tui.engine.text.dsv4_chat import BOS, Dsv4ChatTemplate
from ds4tui.engine.text.hf_tokenizer import IM_START, ChatMLTemplate

# Turn formats known by their opening (after the BOS their templates write first).
_OPENINGS = (("<bos><start_of_turn>", "gemma"), ("<|begin_of_text|><|start_header_id|>", "llama3"))


def parse_transcript(text: str) -> list[dict] | None:
    """The messages of `text`, or None when no known template wrote it (or it does not parse)."""
    if text.startswith(IM_START):
        template = ChatMLTemplate(None)
    elif text.startswith(BOS):
        template = Dsv4ChatTemplate()
    else:
        fmt = next((TURN_FORMATS[name] for opening, name in _OPENINGS if text.startswith(opening)), None)
        if fmt is None:
            return None
        return fmt.parse(text) or None
    try:
        return template.parse(text)
    except ValueError:
        return None


def first_user_message(text: str) -> str | None:
    """The first user turn of a stored transcript (a checkpoint's name when it has no title)."""
    messages = parse_transcript(text) or []
    return next((m["content"] for m in messages if m.get("role") == "user" and m.get("content", "").strip()),
                None)
