"""The bytes ds4tui shares with ds4: the KVC envelope and header, payload framing, ids, SWA tags.

Pure Python (no torch, textual or rich; a test checks) and imports nothing else of ds4tui.
"""
