"""The right to write one index or crawl directory, held by one job at a time
(`IndexLease`, docs/OPERATING.md "What is locked, and how"), made exclusive on
object stores by their conditional writes (ritrag.storage.ConditionalObject)."""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from ritrag.storage import ConditionalObject, exists, is_remote, open_read, remove_file, write_atomic

if TYPE_CHECKING:
    from ritrag.layout import IndexLayout

LOG = logging.getLogger("ritrag.lease")
LEASE_FILE = "LEASE"


class IndexLockedError(Exception):
    """Another job holds the index's (or crawl directory's) lease."""


class IndexLease:
    """The right to write one index, held by one job at a time (build, update,
    compact, prune, rollback): the file LEASE, created only if absent, holding
    who holds it (owner, pid, host, start) and the segment it writes.

    On a local disk the file is written aside and hard-linked into place,
    which fails when it exists, so of two jobs exactly one gets it, and never
    an empty one. A second job fails fast with IndexLockedError naming the
    holder. A lease whose holder is dead (a pid that no longer runs on this
    host) is stale and taken over; one from another host, or unreadable, is
    taken over only with `break_lock`. On S3 and GCS the store's own
    preconditions make the lease exclusive (`ConditionalObject`): created only
    if absent, rewritten and deleted only while it is still the version this
    job wrote. On any other store (no preconditions here) it is written
    if absent and read back, a check with a short race window
    (docs/OPERATING.md).
    """

    def __init__(self, layout: "IndexLayout", owner: str, break_lock: bool = False):
        self.path = os.path.join(layout.root, LEASE_FILE)
        self.record = {"owner": owner, "pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.time(), "token": os.urandom(8).hex(), "segment": None}
        self._break_lock = break_lock
        self._held = False
        self._object = ConditionalObject.of(self.path)
        self._version: str | None = None  # the object's version this job wrote (S3 ETag, GCS generation)

    def __enter__(self) -> "IndexLease":
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lease, or raise IndexLockedError naming its holder."""
        for _ in range(2):  # a second try after taking over a stale lease
            if self._create():
                self._held = True
                return
            holder, version = self._read()
            if not (self._break_lock or _is_stale(holder)):
                raise IndexLockedError(
                    f"{self.path}: held by {_describe(holder)}; another job writes this index. Wait for it, "
                    f"or, if it is gone, rerun with --break_lock")
            LOG.warning("taking over the lease of %s (%s)", _describe(holder),
                        "--break_lock" if self._break_lock else "its process is gone")
            # Only the lease just read, not one that a job taking it over first wrote meanwhile.
            if self._object is not None:
                self._object.delete(version)
            elif self.holder() == holder:
                _remove(self.path)
        raise IndexLockedError(f"{self.path}: another job took the lease while this one took over a stale one")

    def claim_segment(self, segment_id: str) -> None:
        """Record the segment this job writes (what a person reading LEASE sees)."""
        self.record["segment"] = segment_id
        data = json.dumps(self.record).encode()
        if self._object is None:
            write_atomic(self.path, data)
            return
        self._version = self._object.put(data, self._version)
        if self._version is None:
            self._held = False
            raise IndexLockedError(f"{self.path}: this job's lease was taken over (--break_lock?) by "
                                   f"{_describe(self.holder())}; not writing")

    def holder(self) -> dict[str, Any] | None:
        """The lease's record; None when absent or unreadable."""
        return self._read()[0]

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the lease's record or None, the version of the object read: None but on S3 and GCS)."""
        if self._object is None:
            return _record_at(self.path), None
        try:
            data, version = self._object.read()
        except OSError:
            return None, None
        return _record(data), version

    def release(self) -> None:
        """Give the lease back, if this job still holds it."""
        if self._held and self._object is not None:
            if not self._object.delete(self._version):
                LOG.warning("%s: not deleted: another job took the lease over from this one", self.path)
        elif self._held and (self.holder() or {}).get("token") == self.record["token"]:
            _remove(self.path)
        self._held = False

    def _create(self) -> bool:
        data = json.dumps(self.record).encode()
        if is_remote(self.path):
            if exists(self.path):
                return False
            if self._object is None:
                write_atomic(self.path, data)
            else:
                self._version = self._object.put(data, None)
                if self._version is None:
                    return False
            # Read back: a store that ignores the precondition (some S3-compatible
            # ones) lets the last writer win; only it sees its own token.
            return (self.holder() or {}).get("token") == self.record["token"]
        try:
            write_atomic(self.path, data, exclusive=True)
            return True
        except FileExistsError:
            return False


def lease_holder(root: str) -> dict[str, Any] | None:
    """The record of whoever holds the lease of the index (or crawl directory)
    at `root`: owner, pid, host, the segment it writes; None when no lease is
    held or it is unreadable. What a job deleting unreferenced segments
    (`ritrag.layout.prune_versions`) must spare."""
    return _record_at(os.path.join(root, LEASE_FILE))


def _record_at(path: str) -> dict[str, Any] | None:
    try:
        with open_read(path) as fh:
            return _record(fh.read())
    except OSError:
        return None


def _record(data: bytes) -> dict[str, Any] | None:
    """A lease's record from its bytes; None when they are not one."""
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _is_stale(holder: dict[str, Any] | None) -> bool:
    """A lease held by a process of this host that no longer runs."""
    if holder is None or holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # runs, as another user
        return False
    return False


def _describe(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "an unreadable lease"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(holder.get("started") or 0))
    return (f"{holder.get('owner')} (pid {holder.get('pid')} on {holder.get('host')}, since {started}Z, "
            f"writing {holder.get('segment') or 'no segment yet'})")


def _remove(path: str) -> None:
    try:
        remove_file(path)
    except FileNotFoundError:
        pass
