"""Hot swap: a serving process follows CURRENT to each newly published version.

`VersionWatcher` polls the index's CURRENT file. When it names another version,
the new version is loaded in the watcher's thread while the old one keeps
answering; then `ToolService.index` is replaced by one assignment. A request
reads that attribute once, so requests in flight finish on the version they
started with, and none waits for the load. The query model is handed over when
both versions use the same embedder spec. Memory peaks at two loaded
versions during a swap.

An index in an object store (serving.remote) is polled there: the new
version is copied into the cache and verified whole before it is loaded, so
a swap never reaches a partial or damaged copy; after a swap, cached versions
beyond the cache's limits are evicted (never the one served).

Whatever goes wrong while checking or loading (a CURRENT that names no
version, a damaged or missing file, a load that raises) is logged, counted
(`failures`) and kept as `last_error` for /readyz and /metrics; the old
version stays live, and the next tick tries again, so a version repaired in
place, or a CURRENT fixed, is picked up without a restart.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ritrag.layout import IndexLayout, IndexLoadError
from ritrag.storage import is_remote
from ritrag.serving.api import RitragIndex
from ritrag.serving.remote import default_cache_dir, mirror
from ritrag.serving.tools import ToolService

LOG = logging.getLogger("ritrag.serving.reload")


class VersionWatcher:
    """Swaps `service.index` to the version CURRENT names, checking every `interval_s`."""

    def __init__(self, service: ToolService, index_dir: str, interval_s: float = 10.0,
                 cache_dir: str | None = None):
        self._service = service
        self._mirror = mirror(index_dir, cache_dir or default_cache_dir()) if is_remote(index_dir) else None
        self._layout = IndexLayout(index_dir)  # what current_version() asks: local, or the store's CURRENT
        self._index_dir = index_dir
        self._interval_s = interval_s
        self._cache_dir = cache_dir
        self.failures = 0  # checks or loads that raised, since start
        self.swaps = 0  # versions swapped in, since start
        self.last_error: dict[str, Any] | None = None  # the latest failure; None once a check succeeds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ritrag-version-watcher", daemon=True)

    def start(self) -> "VersionWatcher":
        if self._mirror is not None:
            self._mirror.mark_serving(self._service.index.version)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def check_once(self) -> bool:
        """Swap if CURRENT names a new version; True when a swap happened.
        Never raises: a failure is recorded and the old version kept."""
        live = self._service.index
        current = None
        try:
            if self._mirror is not None:
                self._mirror.mark_serving(live.version)
            current = self._layout.current_version()
            if current is None or current == live.version:
                self.last_error = None
                return False
            started = time.monotonic()
            LOG.info("loading %s (serving %s)", current, live.version)
            fresh = RitragIndex(self._index_dir, current, cache_dir=self._cache_dir)
            fresh.adopt_embedder(live)
            fresh.embed_query("warm up")
        except Exception as exc:  # the old version keeps serving; the trace of a bug goes to the log
            message = f"{type(exc).__name__}: {exc}"
            if (self.last_error or {}).get("message") == message:  # the same failure again: one line
                LOG.warning("version %s still fails to load: %s", current, message)
            elif isinstance(exc, IndexLoadError):  # a refused version, not a bug: one line, no trace
                LOG.error("reload refused: %s (still serving %s)", message, live.version)
            else:
                LOG.exception("checking or loading version %s failed; still serving %s", current, live.version)
            self.failures += 1
            self.last_error = {"version": current, "message": message, "at": time.time()}
            return False
        self._service.index = fresh
        self.swaps += 1
        self.last_error = None
        LOG.info("swapped %s -> %s in %.1f s: %s", live.version, current, time.monotonic() - started, fresh.summary())
        if self._mirror is not None:
            try:
                self._mirror.mark_serving(current)
                self._mirror.evict(serving=current)
            except OSError:  # the cache keeps an extra version until the next swap
                LOG.exception("evicting old versions from the cache of %s failed", self._index_dir)
        return True

    def status(self) -> dict[str, Any]:
        """What /readyz shows of the watcher: failures since start and the latest one."""
        return {"failures": self.failures, "swaps": self.swaps, "last_error": self.last_error}

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check_once()
