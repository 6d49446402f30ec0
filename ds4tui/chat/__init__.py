"""The headless chat: conversations, checkpoints and streaming (no Textual here; see controller.py)."""
