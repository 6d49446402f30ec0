"""The bytes ds4tui shares with ds4: the KVC envelope and header, payload framing, ids, SWA tags;
and how file-derived text and byte counts are shown (`display.py`: the one terminal-safety rule).

Pure Python (no torch, textual or rich; a test checks) and imports nothing else of ds4tui.
"""
