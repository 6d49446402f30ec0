"""The disk KV cache: KVC files, the store over a directory, policy and events.

Pure Python on purpose (no torch, no Textual, no Rich): the cache lists and
checks foreign files (a ds4 cache directory) without loading a model, and the
UI imports it cheaply. A test imports this package in a fresh interpreter and
checks that none of those ended up in sys.modules.

    kvc.py       the byte layout (header, trailers, names, tables)
    entry.py     one file decoded for people (KvEntry, inspect_file, Acceptor)
    policy.py    tunables: store length, frontiers, headroom, eviction score
    eviction.py  superseded checkpoints and the victim order
    store.py     the directory: lookup, load chain, atomic save, touch, pin, evict
    events.py    what the store did (Saved, Hit, Miss, Rejected, Evicted, SaveFailed)
"""

from ds4tui.cache.entry import ANY_DS4TUI, Acceptor, KvEntry, inspect_file
from ds4tui.cache.events import Evicted, EvictedFile, Hit, Miss, Rejected, Saved, SaveFailed
from ds4tui.format.kvc import KvcFile, KvcFormatError, KvcHeader
from ds4tui.cache.policy import DEFAULT_POLICY, CachePolicy, ScoreParts
from ds4tui.cache.store import KvStore, LoadResult, SaveResult

__all__ = [
    "ANY_DS4TUI", "Acceptor", "CachePolicy", "DEFAULT_POLICY", "Evicted", "EvictedFile", "Hit",
    "KvEntry", "KvStore", "KvcFile", "KvcFormatError", "KvcHeader", "LoadResult", "Miss",
    "Rejected", "SaveFailed", "SaveResult", "Saved", "ScoreParts", "inspect_file",
]
