"""Hot swap: a serving process follows CURRENT to each newly published version.

`VersionWatcher` polls the index's CURRENT file. When it names another version,
the new version is loaded in the watcher's thread while the old one keeps
answering; then `ToolService.index` is replaced by one assignment. A request
reads that attribute once, so requests in flight finish on the version they
started with, and none waits for the load. The query model is handed over when
both versions use the same embedder spec. A version that fails to load is
logged and the old one stays live; it is retried only once CURRENT changes again.
Memory peaks at two loaded versions during a swap.
"""
from __future__ import annotations

import logging
import threading

from ritrag.layout import IndexLayout
from serving.api import RitragIndex
from serving.tools import ToolService

LOG = logging.getLogger("ritrag.serving.reload")


class VersionWatcher:
    """Swaps `service.index` to the version CURRENT names, checking every `interval_s`."""

    def __init__(self, service: ToolService, index_dir: str, interval_s: float = 10.0,
                 cache_dir: str | None = None):
        self._service = service
        self._layout = IndexLayout(index_dir)
        self._index_dir = index_dir
        self._interval_s = interval_s
        self._cache_dir = cache_dir
        self._failed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ritrag-version-watcher", daemon=True)

    def start(self) -> "VersionWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def check_once(self) -> bool:
        """Swap if CURRENT names a new version; True when a swap happened."""
        current = self._layout.current_version()
        live = self._service.index
        if current is None or current == live.version or current == self._failed:
            return False
        try:
            fresh = RitragIndex(self._index_dir, current, cache_dir=self._cache_dir)
            fresh.adopt_embedder(live)
            fresh.embed_query("warm up")
        except Exception:  # the old version keeps serving; the trace goes to the log
            LOG.exception("loading version %s failed; still serving %s", current, live.version)
            self._failed = current
            return False
        self._service.index = fresh
        self._failed = None
        LOG.info("now serving %s (was %s)", current, live.version)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check_once()
