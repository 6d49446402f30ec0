"""`ds4tui serve`: the engine and its disk cache behind an OpenAI-compatible HTTP API."""
