"""What a reply's Markdown holds, read the way the screen's Markdown widget reads it.

Owns: the code blocks of a reply (for "copy code block N"), parsed by the same
markdown-it "gfm-like" parser Textual's Markdown uses, so block N here is the Nth
framed block on screen.
"""

from __future__ import annotations

from dataclasses import dataclass

from markdown_it import MarkdownIt


@dataclass(frozen=True)
class CodeBlock:
    language: str  # the fence's info word ("" for none, or an indented block)
    code: str  # the block's text, exactly (its last newline kept)

    @property
    def label(self) -> str:
        """E.g. "python, 12 lines"."""
        lines = self.code.count("\n") + (0 if self.code.endswith("\n") else 1)
        return f"{self.language or 'code'}, {lines} line{'s' if lines != 1 else ''}"


_PARSER = MarkdownIt("gfm-like")


def code_blocks(markdown: str) -> list[CodeBlock]:
    """Every fenced or indented code block of `markdown`, in order (nested in lists and quotes too)."""
    return [CodeBlock((t.info or "").split(maxsplit=1)[0] if t.info.strip() else "", t.content)
            for t in _PARSER.parse(markdown) if t.type in ("fence", "code_block")]
