"""The headless chat: conversations, checkpoints and streaming (no Textual here; controller.py is the facade)."""
