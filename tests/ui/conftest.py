"""Fixtures of the UI tests: the session's tiny-llama (tests/ui/chat_app.py builds it)."""

from tests.ui.chat_app import tiny_llama  # noqa: F401 (a fixture, found here by pytest)
