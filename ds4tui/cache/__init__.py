"""The disk KV cache: KVC files, the store over a directory, policy and events.

Pure Python on purpose (no torch, no Textual, no Rich): the cache lists and
checks foreign files (a ds4 cache directory) without loading a model, and the
UI imports it cheaply. A test imports this package in a fresh interpreter and
checks that none of those ended up in sys.modules.

    entry.py     one file decoded for people (KvEntry, inspect_file, Acceptor)
    policy.py    tunables: store length, frontiers, headroom, eviction score
    eviction.py  superseded checkpoints, the victim order, the dry-run EvictionPlan
    prefixes.py  which stored texts start with which (one sort, for eviction and the browser)
    index.py     the header index: each file version's listing fields and text, in SQLite beside the files
    store.py     KvStore, the facade the rest of ds4tui holds: lookup, load, save, touch, pin, evict
    listing.py   the directory under its budget: names, every file decoded and scored
    lookup.py    the files whose text prefixes a prompt (stat-keyed header and text-SHA memos)
    loading.py   the load validation chain, the payload through its checksum
    saving.py    atomic saves within the budget, and applying eviction
    edits.py     changes to existing files: hit count, pin, delete, retitle
    files.py     atomic writes, in-place header edits, temp files, header repair
    safe_open.py regular files only: no FIFO blocks, no symlink is followed
    integrity.py the XXH3 checksum: hashed on write, verified while restoring
    events.py    what the store did (Saved, Hit, Miss, Rejected, Evicted, SaveFailed)
    watch.py     changes to the directory, debounced
    scan.py      one pass over a directory for the cache browser (entries, headers, text index)

The byte layout (header, trailers, names) is `ds4tui.format.kvc`; how file text
and sizes are shown, `ds4tui.format.display`.
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
