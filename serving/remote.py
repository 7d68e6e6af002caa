"""Serving an index published to an object store: a local, verified mirror.

A build on Dataflow, Flink or Spark publishes to gs://, s3:// or any fsspec URL
the way it publishes to a disk (segment files, then the manifest, then CURRENT
last). A replica reads CURRENT and the manifest there (`IndexLayout`, the jobs'
reader, over the storage layer, ritrag/storage.py), copies the version's files
into its cache directory and serves the copy through the local loader:

```
CACHE_DIR/mirror-<sha256(uri)[:12]>/
  versions/v000003.json        written once every file it names is cached and verified
  segments/<segment-id>/<file> the copies (segments are shared by versions, as in the store)
  segments/<segment-id>/.<file>.part   a copy in progress; resumed after a restart, never trusted
  verified/<segment-id>/<file>.json    stamp: the file was hashed once against the manifest
  serving/<version>/<host>-<pid>       touched while a process serves that version
  .lock                                one process fetches or evicts at a time
```

Each file is hashed while it streams in and compared with the manifest's size
and sha256; only then is it renamed into place and stamped (its sha256, size
and mtime). A stamped file whose size and mtime still match is trusted without
hashing it again, so a restart over a warm cache reads no file twice. A
`.part` left by a crash is resumed from its length (the bytes it holds are
hashed first); when the result does not match, it is copied again from the
start once, and a second mismatch refuses the version (DamagedIndexError) so
the previous version keeps serving.

A local index served with a cache directory is not copied, but its files'
stamps are kept the same way, in CACHE_DIR/verified-<sha256(absolute path)[:12]>/
(`local_stamps`): hashed at the first load, trusted by size and mtime after.

Versions beyond `keep_versions`, or past `max_bytes` of files, are evicted
oldest first: never one that a process sharing the cache serves (its marker
under serving/ is younger than `in_use_s`).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from ritrag.layout import DamagedIndexError, IndexLayout, IndexLoadError, Manifest, MissingIndexError
from ritrag.storage import StoreUnavailableError, filesystem, sha256_file, write_atomic
from ritrag.serving.errors import ToolError

LOG = logging.getLogger("ritrag.serving.remote")
BLOCK = 4 << 20


def default_cache_dir() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ritrag")


@dataclass
class CacheProgress:
    """What the mirror has done, for /metrics: the version being fetched (its
    files and bytes, all and cached so far) and totals since start."""

    version: str | None = None
    files_total: int = 0
    files_done: int = 0
    bytes_total: int = 0
    bytes_done: int = 0
    bytes_copied: int = 0  # since start, all versions: what came over the network
    files_refused: int = 0  # copies whose size or sha256 did not match the manifest
    evicted_versions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class StampedLayout(IndexLayout):
    """An index directory whose files are trusted by their stamps:
    `verified_path` hashes a file only when its stamp is missing or no longer
    matches it (sha256 of the manifest, size, mtime), and stamps it once it
    matched. Stamps live under `stamps`: the mirror's own verified/ folder by
    default; a local index, which may be read-only, keeps them in the cache
    directory (`local_stamps`)."""

    def __init__(self, root: str, stamps: str | None = None):
        super().__init__(root)
        self.stamps = stamps or os.path.join(root, "verified")
        self.stamping = True

    def stamp_path(self, segment_id: str, name: str) -> str:
        return os.path.join(self.stamps, segment_id, f"{name}.json")

    def is_stamped(self, segment: dict[str, Any], name: str) -> bool:
        path = os.path.join(self.segment_dir(segment["id"]), name)
        expected = segment["files"].get(name)
        try:
            with open(self.stamp_path(segment["id"], name), encoding="utf-8") as fh:
                stamp = json.load(fh)
            stat = os.stat(path)
        except (OSError, ValueError):
            return False
        return (expected is not None and isinstance(stamp, dict) and stamp.get("sha256") == expected["sha256"]
                and stat.st_size == expected["bytes"] == stamp.get("bytes")
                and stamp.get("mtime_ns") == stat.st_mtime_ns)

    def stamp(self, segment_id: str, name: str, sha256: str, stat: os.stat_result | None = None) -> None:
        """Record that the file, as `stat` saw it (default: now), hashed to `sha256`."""
        stat = stat or os.stat(os.path.join(self.segment_dir(segment_id), name))
        write_atomic(self.stamp_path(segment_id, name),
                     json.dumps({"sha256": sha256, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}).encode())

    def verified_path(self, segment: dict[str, Any], name: str) -> str:
        path = os.path.join(self.segment_dir(segment["id"]), name)
        if self.is_stamped(segment, name):
            return path
        before = os.stat(path) if os.path.exists(path) else None
        super().verified_path(segment, name)
        # Stamped as it was before hashing, and only if hashing did not race a writer.
        after = os.stat(path)
        if self.stamping and before is not None and (before.st_size, before.st_mtime_ns, before.st_ino) == (
                after.st_size, after.st_mtime_ns, after.st_ino):
            try:
                self.stamp(segment["id"], name, segment["files"][name]["sha256"], before)
            except OSError as exc:
                LOG.warning("cannot stamp verified files in %s (%s); they are hashed again at every load",
                            self.stamps, exc)
                self.stamping = False  # said once, not once per file
        return path


def local_stamps(cache_dir: str, root: str) -> str:
    """Where the stamps of a local index's files are kept in `cache_dir`: named
    by the index's absolute path, as a mirror is named by its URI."""
    return os.path.join(cache_dir, "verified-" + hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:12])


class VerifiedCopier:
    """Copies files of one index from its store (`fs`, under `root`) into the
    mirror's `layout`: each is hashed while it streams in and compared with
    the manifest before it is renamed into place and stamped."""

    def __init__(self, fs: Any, root: str, uri: str, layout: StampedLayout, progress: CacheProgress):
        self.fs, self.root, self.uri, self.layout, self.progress = fs, root, uri, layout, progress

    def ensure(self, segment_id: str, name: str, entry: dict[str, Any]) -> int:
        """Make one file present and verified; returns the bytes copied."""
        segment = {"id": segment_id, "files": {name: entry}}
        local = os.path.join(self.layout.segment_dir(segment_id), name)
        copied = 0
        if not self.layout.is_stamped(segment, name):
            if os.path.exists(local):  # there but not stamped: a crash between rename and stamp
                if os.path.getsize(local) == entry["bytes"] and sha256_file(local) == entry["sha256"]:
                    self.layout.stamp(segment_id, name, entry["sha256"])
                else:
                    os.unlink(local)
            if not os.path.exists(local):
                copied = self._copy(segment_id, name, entry)
                self.layout.stamp(segment_id, name, entry["sha256"])
        self.progress.add(files_done=1, bytes_done=entry["bytes"])
        return copied

    def _copy(self, segment_id: str, name: str, entry: dict[str, Any]) -> int:
        """Stream the file into `.<name>.part` (resuming one a crash left),
        check it, rename it into place; returns the bytes copied."""
        directory = self.layout.segment_dir(segment_id)
        os.makedirs(directory, exist_ok=True)
        part, local = os.path.join(directory, f".{name}.part"), os.path.join(directory, name)
        remote = "/".join((self.root, "segments", segment_id, name))
        copied = 0
        for attempt in range(2):
            digest, have = hashlib.sha256(), 0
            if attempt == 0 and os.path.exists(part) and os.path.getsize(part) <= entry["bytes"]:
                with open(part, "rb") as fh:  # the bytes a crash left: hashed, then continued
                    while chunk := fh.read(BLOCK):
                        digest.update(chunk)
                have = os.path.getsize(part)
            with self.fs.open(remote, "rb") as src, open(part, "ab" if have else "wb") as dst:
                if have:
                    src.seek(have)
                # One byte past the size the manifest states shows an object too large; no more is read.
                left = entry["bytes"] - have + 1
                while left > 0 and (chunk := src.read(min(BLOCK, left))):
                    left -= len(chunk)
                    digest.update(chunk)
                    dst.write(chunk)
                    copied += len(chunk)
                    self.progress.add(bytes_copied=len(chunk))
                dst.flush()
                os.fsync(dst.fileno())
            if os.path.getsize(part) == entry["bytes"] and digest.hexdigest() == entry["sha256"]:
                os.replace(part, local)
                return copied
            os.unlink(part)
            self.progress.add(files_refused=1)
            if not have:  # copied whole from the store and still wrong: the object itself is damaged
                break
            LOG.warning("%s: the resumed copy does not match the manifest; copying it again", remote)
        raise DamagedIndexError(f"{self.uri}/segments/{segment_id}/{name}: size or sha256 differs from the manifest "
                                f"of the version; refusing it")


class IndexMirror:
    """One object-store index mirrored into a local cache; shared by the
    loads of one process (`mirror`), and by processes through `.lock`."""

    def __init__(self, uri: str, cache_dir: str, keep_versions: int = 2, max_bytes: int | None = None,
                 workers: int = 8, in_use_s: float = 600.0):
        self.uri = uri.rstrip("/")
        try:
            self.fs, self.root = filesystem(self.uri)
        except StoreUnavailableError as exc:
            raise IndexLoadError(f"serving {exc}") from None
        self.root = self.root.rstrip("/")
        self.remote = IndexLayout(self.uri)  # the store's CURRENT and manifests, read as a job reads them
        self.local_root = os.path.join(cache_dir, "mirror-" + hashlib.sha256(self.uri.encode()).hexdigest()[:12])
        self.layout = StampedLayout(self.local_root)
        self.keep_versions = keep_versions
        self.max_bytes = max_bytes
        self.workers = workers
        self.in_use_s = in_use_s
        self.progress = CacheProgress()
        self._lock = threading.Lock()  # one fetch or eviction of this process at a time
        self._copier = VerifiedCopier(self.fs, self.root, self.uri, self.layout, self.progress)
        try:
            os.makedirs(self.local_root, exist_ok=True)
        except OSError as exc:  # the cache directory is a file, unwritable, ...
            raise ToolError("invalid_arguments", f"cache directory {cache_dir}: cannot hold the copy of {self.uri} "
                            f"({exc.strerror or exc})") from None

    def cached_versions(self) -> list[str]:
        """Versions whose every file is cached and verified, oldest first."""
        return self.layout.versions()

    def fetch(self, version: str | None = None) -> str:
        """Cache `version` (default: the one CURRENT names) whole and verified;
        returns its name. Raises (and caches no manifest) when a file cannot
        be copied or does not match the manifest."""
        version = version or self.remote.current_version()
        if version is None:
            raise MissingIndexError(f"{self.uri}: no published version (CURRENT is missing)")
        with self._exclusive():
            # A cached version is checked again (a stat per file), so a file damaged on disk is copied anew.
            cached = version in self.cached_versions()
            manifest = self.layout.load_manifest(version) if cached else self.remote.load_manifest(version)
            files = [(seg["id"], name, entry) for seg in manifest.segments for name, entry in seg["files"].items()]
            with self.progress.lock:
                self.progress.version, self.progress.files_total = version, len(files)
                self.progress.bytes_total = sum(entry["bytes"] for _, _, entry in files)
                self.progress.files_done = self.progress.bytes_done = 0
            start = time.monotonic()
            with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="ritrag-cache") as pool:
                copied = sum(pool.map(lambda item: self._copier.ensure(*item), files))
            if not cached:
                write_atomic(self.layout.manifest_path(version), manifest.to_json())
            LOG.info("cached %s from %s: %d files, %d bytes copied in %.1f s", version, self.uri, len(files), copied,
                     time.monotonic() - start)
            return version

    def mark_serving(self, version: str) -> None:
        """Record that this process serves `version` (touched again at each
        watcher check), so that no process sharing the cache evicts it."""
        marker = os.path.join(self.local_root, "serving", version, f"{socket.gethostname()}-{os.getpid()}")
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        for stale in _own_markers(self.local_root, os.path.basename(marker)):
            if stale != marker:
                os.unlink(stale)
        with open(marker, "a"):
            os.utime(marker)

    def evict(self, serving: str) -> list[str]:
        """Delete cached versions beyond `keep_versions` or `max_bytes`, oldest
        first, never `serving` nor one another process marks as served, then
        every segment file no kept version names; returns the evicted versions."""
        with self._exclusive():
            versions = self.cached_versions()
            manifests = {v: self.layout.load_manifest(v) for v in versions}
            protected = {serving} | versions_in_use(self.local_root, self.in_use_s)
            evicted = versions_to_evict(manifests, protected, self.keep_versions, self.max_bytes)
            kept = [v for v in versions if v not in evicted]
            for version in evicted:
                os.unlink(self.layout.manifest_path(version))
                shutil.rmtree(os.path.join(self.local_root, "serving", version), ignore_errors=True)
            if evicted:
                drop_unreferenced(self.local_root, {(seg["id"], name) for v in kept for seg in manifests[v].segments
                                                    for name in seg["files"]})
                self.progress.add(evicted_versions=len(evicted))
                LOG.info("evicted cached versions %s of %s", ", ".join(evicted), self.uri)
            return evicted

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """This process's lock, then the cache's file lock (replicas sharing a
        cache volume fetch one at a time; the second finds the files stamped)."""
        with self._lock, open(os.path.join(self.local_root, ".lock"), "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def versions_to_evict(manifests: dict[str, Manifest], protected: set[str], keep_versions: int,
                      max_bytes: int | None) -> list[str]:
    """Of the cached versions (`manifests`, oldest first), those to evict,
    oldest first, until at most `keep_versions` remain and their files (each
    counted once) fit in `max_bytes`; a `protected` one is never evicted."""
    kept, evicted = list(manifests), []

    def size(of: list[str]) -> int:
        files = {(seg["id"], name): entry["bytes"] for v in of for seg in manifests[v].segments
                 for name, entry in seg["files"].items()}
        return sum(files.values())

    for version in list(manifests):
        if not (len(kept) > keep_versions or (max_bytes is not None and size(kept) > max_bytes)):
            break
        if version not in protected:
            kept.remove(version)
            evicted.append(version)
    return evicted


def drop_unreferenced(local_root: str, referenced: set[tuple[str, str]]) -> None:
    """Delete every cached file and stamp of the mirror at `local_root` that
    no (segment, file) in `referenced` names."""
    for top in ("segments", "verified"):
        base = os.path.join(local_root, top)
        for segment_id in os.listdir(base) if os.path.isdir(base) else []:
            directory = os.path.join(base, segment_id)
            for name in os.listdir(directory):
                file_name = name[:-5] if top == "verified" else name
                if (segment_id, file_name) not in referenced:
                    os.unlink(os.path.join(directory, name))
            if not os.listdir(directory):
                os.rmdir(directory)


def versions_in_use(local_root: str, in_use_s: float) -> set[str]:
    """Versions a process sharing the mirror at `local_root` marked as served within `in_use_s`."""
    base, now, found = os.path.join(local_root, "serving"), time.time(), set()
    for version in os.listdir(base) if os.path.isdir(base) else []:
        for marker in os.listdir(os.path.join(base, version)):
            try:
                if now - os.path.getmtime(os.path.join(base, version, marker)) <= in_use_s:
                    found.add(version)
            except FileNotFoundError:
                pass
    return found


def _own_markers(root: str, name: str) -> list[str]:
    base = os.path.join(root, "serving")
    return [os.path.join(base, v, name) for v in (os.listdir(base) if os.path.isdir(base) else [])
            if os.path.exists(os.path.join(base, v, name))]


_MIRRORS: dict[tuple[str, str], IndexMirror] = {}
_MIRRORS_LOCK = threading.Lock()


def mirror(uri: str, cache_dir: str | None = None, **settings: Any) -> IndexMirror:
    """The process's mirror of `uri` in `cache_dir` (default: ~/.cache/ritrag),
    made on first use; `settings` (keep_versions, max_bytes, workers) apply
    when given."""
    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    key = (uri.rstrip("/"), cache_dir)
    with _MIRRORS_LOCK:
        if key not in _MIRRORS:
            _MIRRORS[key] = IndexMirror(uri, cache_dir, **settings)
        found = _MIRRORS[key]
        for name, value in settings.items():
            setattr(found, name, value)
        return found


def mirrors() -> list[IndexMirror]:
    """Every mirror this process made (for /metrics)."""
    with _MIRRORS_LOCK:
        return list(_MIRRORS.values())
