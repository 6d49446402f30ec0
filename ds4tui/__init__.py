"""ds4tui: a terminal chat app on an embedded PyTorch engine with a disk KV cache (KVC format).

Importing the package is cheap on purpose: torch and textual load only when a
command needs them.
"""

__version__ = "0.1.0"
