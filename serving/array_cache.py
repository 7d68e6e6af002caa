"""The cache of a version's derived arrays (ritrag.serving.derived_arrays),
for `--cache_dir`: derived once, saved, then memory-mapped by every later
load. A restart skips their assembly, pages no query touches are never read,
and several server processes on one machine share one copy in the page cache
instead of each holding its own. The format is in `open_cache`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from typing import Callable

import numpy as np
import pyarrow as pa

from ritrag.layout import Manifest

LOG = logging.getLogger("ritrag.serving")
# The cache's folder per version, renamed when the arrays change so that a
# cache of other arrays is never mapped ("postings", then "arrays", before
# the row kinds and the link graph).
CACHE_NAME = "arrays-2"
SKELETON_FILE = "skeleton.arrow"
SHAPES_FILE = "shapes.json"
# How a derived array of one item per posting is allocated: (name, items, dtype).
Allocate = Callable[[str, int, type], np.ndarray]


def cache_directory(cache_dir: str, manifest: Manifest) -> str:
    """Where the arrays derived from `manifest`'s files are kept, named by
    the version and the checksums of its files, so they never go stale."""
    files = json.dumps([seg["files"] for seg in manifest.segments], sort_keys=True).encode()
    return os.path.join(cache_dir, f"{manifest.version}-{hashlib.sha256(files).hexdigest()[:16]}", CACHE_NAME)


def open_cache(directory: str, n_node_rows: int, n_terms: int) -> tuple[pa.Table, dict[str, np.ndarray]] | None:
    """The skeleton table and derived arrays cached in `directory`,
    memory-mapped; None when there are none, or when they are not whole.

    Format: `skeleton.arrow`, the SKELETON_COLUMNS of every node row as one
    uncompressed Arrow IPC file (mapped zero-copy); one `NAME.npy` per derived
    array; `shapes.json`, {NAME: shape}, written last. A cache is refused (and
    deleted, so the caller rebuilds it) when a file is missing or cut short
    (numpy refuses to map it), an array's shape is not the recorded one, or
    the node rows or terms do not fit this version's. (No checksum: reading
    every page at each start is what the cache avoids; the folder's name
    carries the version's checksums.)"""
    if not os.path.isdir(directory):
        return None
    try:
        with open(os.path.join(directory, SHAPES_FILE), encoding="utf-8") as fh:
            shapes = json.load(fh)
        arrays = {name: np.load(os.path.join(directory, f"{name}.npy"), mmap_mode="r") for name in shapes}
        bad = [name for name, shape in shapes.items() if list(arrays[name].shape) != shape]
        table = pa.ipc.open_file(pa.memory_map(os.path.join(directory, SKELETON_FILE))).read_all()
        if table.num_rows != n_node_rows or len(arrays["indptr"]) != n_terms + 1:
            bad.append("rows of another version")
        if bad:
            raise ValueError(f"arrays of the wrong shape: {', '.join(bad)}")
    except (OSError, ValueError, KeyError, pa.ArrowInvalid) as exc:
        LOG.warning("%s: cached arrays are damaged (%s); rebuilding them", directory, exc)
        shutil.rmtree(directory, ignore_errors=True)
        return None
    return table, arrays


class CacheBeingWritten:
    """A cache (`open_cache`) written in a temporary folder beside its place
    and renamed into place by `commit`, so a reader never sees half a cache;
    a concurrent writer's copy wins. The arrays too large to hold twice are
    allocated in it as files (`empty`) and filled in place: at 10M chunks the
    postings alone are 7 GiB, which then cost page cache the kernel can write
    back instead of anonymous memory on top of everything else the first load
    holds. Leaving the `with` block without a commit removes the folder. A
    cache that cannot be written (the folder cannot be made) is logged and
    skipped: the arrays are then held in memory, as without a cache."""

    def __init__(self, directory: str):
        self.directory = directory
        self.tmp: str | None = f"{directory}.tmp-{os.getpid()}"
        self.files: dict[str, np.ndarray] = {}

    def __enter__(self) -> "CacheBeingWritten":
        try:
            os.makedirs(self.tmp, exist_ok=True)
        except OSError as exc:
            LOG.warning("cannot write a cache in %s (%s); the derived arrays are held in memory", self.directory, exc)
            self.tmp = None
        return self

    def __exit__(self, *exc_info) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def empty(self, name: str, n: int, dtype: type) -> np.ndarray:
        """An uninitialized array of `n` items, backed by the file it will be
        cached in. The file's blocks are reserved first: writing into a mapped
        hole on a full disk kills the process (SIGBUS), a failed reservation
        only costs memory (the array is then held in memory)."""
        if self.tmp is None:
            return in_memory(name, n, dtype)
        path = os.path.join(self.tmp, f"{name}.npy")
        try:
            array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n,))
            with open(path, "r+b") as fh:
                os.posix_fallocate(fh.fileno(), 0, os.fstat(fh.fileno()).st_size)
        except OSError as exc:
            LOG.warning("could not reserve %s for the cached %s (%s); holding it in memory", path, name, exc)
            return in_memory(name, n, dtype)
        self.files[name] = array
        return array

    def commit(self, table: pa.Table, arrays: dict[str, np.ndarray]) -> None:
        """Write the skeleton and the arrays not already in their files, then
        the shapes, and rename the folder into place. A failure to write is
        logged, not raised: the server runs on the arrays it holds."""
        if self.tmp is None:
            return
        try:
            with pa.OSFile(os.path.join(self.tmp, SKELETON_FILE), "wb") as sink, \
                    pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            for name, array in arrays.items():
                if self.files.get(name) is array:
                    array.flush()
                else:
                    np.save(os.path.join(self.tmp, f"{name}.npy"), array)
            with open(os.path.join(self.tmp, SHAPES_FILE), "w", encoding="utf-8") as fh:
                json.dump({name: list(array.shape) for name, array in arrays.items()}, fh)
            os.replace(self.tmp, self.directory)
        except OSError:
            LOG.warning("could not cache derived arrays in %s", self.directory, exc_info=True)


def in_memory(name: str, n: int, dtype: type) -> np.ndarray:
    """`CacheBeingWritten.empty` without a cache: an array in memory."""
    return np.empty(n, dtype)
