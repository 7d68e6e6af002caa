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


def save_cache(directory: str, table: pa.Table, arrays: dict[str, np.ndarray]) -> None:
    """Write the cache (`open_cache`) into a fresh directory renamed into
    place, so a reader never sees a half-written cache; a concurrent writer's
    copy wins."""
    tmp = f"{directory}.tmp-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    try:
        with pa.OSFile(os.path.join(tmp, SKELETON_FILE), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        for name, array in arrays.items():
            np.save(os.path.join(tmp, f"{name}.npy"), array)
        with open(os.path.join(tmp, SHAPES_FILE), "w", encoding="utf-8") as fh:
            json.dump({name: list(array.shape) for name, array in arrays.items()}, fh)
        os.replace(tmp, directory)
    except OSError:
        LOG.warning("could not cache derived arrays in %s", directory, exc_info=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
