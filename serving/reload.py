"""Hot swap: a serving process follows CURRENT to each newly published version.

`VersionWatcher` polls the index's CURRENT file. When it names another version,
the new version is loaded in the watcher's thread while the old one keeps
answering; then `ToolService.index` is replaced by one assignment. A request
reads that attribute once, so requests in flight finish on the version they
started with, and none waits for the load. The query model is handed over when
both versions use the same embedder spec. Memory peaks at two loaded
versions during a swap.

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
        self.failures = 0  # checks or loads that raised, since start
        self.last_error: dict[str, Any] | None = None  # the latest failure; None once a check succeeds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ritrag-version-watcher", daemon=True)

    def start(self) -> "VersionWatcher":
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
            current = self._layout.current_version()
            if current is None or current == live.version:
                self.last_error = None
                return False
            fresh = RitragIndex(self._index_dir, current, cache_dir=self._cache_dir)
            fresh.adopt_embedder(live)
            fresh.embed_query("warm up")
        except Exception as exc:  # the old version keeps serving; the trace goes to the log
            message = f"{type(exc).__name__}: {exc}"
            if (self.last_error or {}).get("message") == message:  # the same failure again: one line
                LOG.warning("version %s still fails to load: %s", current, message)
            else:
                LOG.exception("checking or loading version %s failed; still serving %s", current, live.version)
            self.failures += 1
            self.last_error = {"version": current, "message": message, "at": time.time()}
            return False
        self._service.index = fresh
        self.last_error = None
        LOG.info("now serving %s (was %s)", current, live.version)
        return True

    def status(self) -> dict[str, Any]:
        """What /readyz shows of the watcher: failures since start and the latest one."""
        return {"failures": self.failures, "last_error": self.last_error}

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check_once()
