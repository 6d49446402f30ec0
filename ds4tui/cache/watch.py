"""Watch a cache directory for `.kv` files that appear, change or go away.

Owns: a watchdog observer over one directory (not recursive), the filter that
keeps only events that can change what a `.kv` listing shows, and a debouncer
that folds a burst of events into one `CacheChanges` delivered through a plain
callback on the debouncer's own thread.

Leaves to callers: what to do with a change (the cache browser re-reads the
files and hops to its UI thread with `call_from_thread`). No textual import
here: the cache package stays UI-free (docs/development.md, "Layout"; a test checks), so the
watcher can also serve a headless tool.

Why each filter:
- open and close-without-write events are dropped, because the browser reads
  the files it is told about; counting its own reads as changes would loop.
- attribute events are dropped: a `.kv` file's meaning lives in its bytes
  (hits and last_used are rewritten in place, which is a modify event).
- temp files (`<sha>.kv.tmp.<pid>.<rand>`) are dropped; the store writes there
  and then renames onto `<sha>.kv`, which arrives as a move whose destination
  is the `.kv` name.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from ds4tui.format.kvc import sha_from_name

# A burst (a save: create tmp, write, rename; eviction deleting several files)
# settles within a few tens of milliseconds; 150 ms of quiet folds it into one
# change while keeping the browser well inside its one-second promise.
DEFAULT_QUIET_S = 0.15
# Under a steady stream of events (another process touching files in a loop)
# quiet never comes; flush at least this often so the view still follows.
DEFAULT_MAX_DELAY_S = 0.5
# Fallback when inotify is unavailable (watch limit reached, some network mounts).
POLL_INTERVAL_S = 0.5

_EVENT_TYPES = [
    FileCreatedEvent, FileModifiedEvent, FileDeletedEvent, FileMovedEvent,
    FileClosedEvent, DirDeletedEvent, DirMovedEvent,
]


@dataclass(frozen=True)
class CacheChanges:
    """One debounced batch: the SHAs of `.kv` files touched since the last batch.

    `directory_gone` is set when the watched directory itself was deleted or
    moved away; the watch is then dead and the caller should rescan / rewatch.
    """

    shas: frozenset[str]
    directory_gone: bool = False
    # Of `shas`, the files no longer there when the batch was delivered (evicted or deleted,
    # by this process or another): an owner of one (a chat's saved session) can say so.
    removed: frozenset[str] = frozenset()


class _Handler(FileSystemEventHandler):
    def __init__(self, directory: str, record: Callable[[set[str], bool], None]) -> None:
        self._directory = directory
        self._record = record

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            # Only the watched directory itself matters (it is not recursive).
            gone = os.fsdecode(event.src_path).rstrip(os.sep) == self._directory
            if gone and event.event_type in ("deleted", "moved"):
                self._record(set(), True)
            return
        shas = set()
        for path in (event.src_path, event.dest_path):
            if path:
                sha = sha_from_name(os.path.basename(os.fsdecode(path)))
                if sha is not None:
                    shas.add(sha)
        if shas:
            self._record(shas, False)


class CacheWatcher:
    """Watches `directory`; calls `on_change(CacheChanges)` after each burst of changes.

    The callback runs on the watcher's debounce thread, one call at a time;
    it must not block for long (post a message and return). Use as a context
    manager or call `start()` / `stop()`.

    Args:
        directory: an existing directory.
        on_change: receives one `CacheChanges` per debounced burst.
        quiet_s: how long events must stop before a batch is delivered.
        max_delay_s: the longest a batch waits after its first event.
        polling: use the portable polling observer instead of the OS one.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        on_change: Callable[[CacheChanges], None],
        *,
        quiet_s: float = DEFAULT_QUIET_S,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        polling: bool = False,
    ) -> None:
        self.directory = Path(directory).resolve()
        self._on_change = on_change
        self._quiet_s = quiet_s
        self._max_delay_s = max(max_delay_s, quiet_s)
        self._polling = polling
        self._cond = threading.Condition()
        self._pending: set[str] = set()
        self._gone = False
        self._first_at: float | None = None
        self._last_at = 0.0
        self._stopping = False
        self._observer = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> CacheWatcher:
        if not self.directory.is_dir():
            raise FileNotFoundError(f"cache directory {self.directory} does not exist")
        handler = _Handler(str(self.directory), self._record)
        self._observer = self._start_observer(handler)
        self._thread = threading.Thread(target=self._run, name="ds4tui-cache-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; no callback runs after this returns."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._thread = None

    def __enter__(self) -> CacheWatcher:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def polling(self) -> bool:
        """True when the portable polling observer is in use (asked for, or inotify failed)."""
        return self._polling

    # -- internals ---------------------------------------------------------

    def _start_observer(self, handler: _Handler):
        if not self._polling:
            observer = Observer()
            try:
                observer.schedule(handler, str(self.directory), recursive=False, event_filter=_EVENT_TYPES)
                observer.start()
                return observer
            except OSError:
                # inotify watch/instance limits are per user and easy to exhaust
                # (editors, other watchers); polling is slower but always works.
                self._polling = True
        observer = PollingObserver(timeout=POLL_INTERVAL_S)
        observer.schedule(handler, str(self.directory), recursive=False, event_filter=_EVENT_TYPES)
        observer.start()
        return observer

    def _record(self, shas: set[str], gone: bool) -> None:
        now = time.monotonic()
        with self._cond:
            self._pending |= shas
            self._gone = self._gone or gone
            if self._first_at is None:
                self._first_at = now
            self._last_at = now
            self._cond.notify_all()

    def _removed(self, shas: frozenset[str]) -> frozenset[str]:
        return frozenset(s for s in shas if not os.path.lexists(self.directory / f"{s}.kv"))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and self._first_at is None:
                    self._cond.wait()
                if self._stopping:
                    return
                now = time.monotonic()
                due = min(self._last_at + self._quiet_s, self._first_at + self._max_delay_s)
                if now < due:
                    self._cond.wait(due - now)
                    continue
                pending = frozenset(self._pending)
                batch = CacheChanges(pending, self._gone, self._removed(pending))
                self._pending = set()
                self._gone = False
                self._first_at = None
            # Outside the lock: the callback may be slow, and events keep arriving.
            try:
                self._on_change(batch)
            except Exception:  # noqa: BLE001 - a bad callback must not kill the watch
                import logging

                logging.getLogger(__name__).exception("cache watch callback failed")
