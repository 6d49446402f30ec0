"""The conversation store: every chat's history in one SQLite file, local or remote alike.

Owns the record of conversations (titles, model, engine, settings, the message tree with
its branches) and nothing else. The `.kv` files are a cache of computed state that may be
evicted at any time; this store is what must never lose a committed turn. It knows nothing
of torch, Textual, the KV cache or chat templates: the chat layer drives it.

- schema.py: the tables and the migrations between schema versions;
- database.py: the connection (WAL, busy timeout), refusing a file it must not touch;
- conversations.py: the store's API (create, commit a message path, list, load, delete...)
  and `open_store`, with its in-memory fallback.
"""

from ds4tui.store.conversations import ConversationStore, StoredChat, StoredHit, open_store
from ds4tui.store.database import StoreError

__all__ = ["ConversationStore", "StoredChat", "StoredHit", "StoreError", "open_store"]
