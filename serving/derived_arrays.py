"""The node-side arrays a server derives from one version's node files: the
skeleton table with its id map (parents and ancestors are resolved as a query
asks: ritrag.serving.skeleton). The chunk-side arrays, the postings and the
links are the segments' own serving files (ritrag.serving.segments,
ritrag.serving.links), mapped, not derived.

Rows are read through the version's `IndexReader`; the rule of which rows
are live is the reader's. The node files' columns are decoded once per
process: the next version, whose node files begin with the same files,
copies their rows and decodes only the files it adds (`node_columns`).
Node rows keep the position of every row of the node files (`RowPositions`),
dead ones included, so that a body is read by position; no id maps to a dead
row.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Iterable

import numpy as np
import pyarrow as pa

from ritrag.reader import IndexReader, LiveFile, live_mask, read_tombstones
from ritrag.serving.skeleton import HELD_COLUMNS, SKELETON_COLUMNS, NodeRows, Skeleton, skeleton_columns


class NodeColumns:
    """The skeleton columns of a list of node files, one array each (a query
    takes rows from one array; from chunked arrays Arrow would concatenate them
    at every take). `files_read`: how many of those files were decoded to make
    it, the others' rows copied from an earlier version's (`node_columns`).

    `node_files`: those files, (path, sha256) in manifest order (`node_files`).
    `node_row`, once `derive_nodes` made it: the live ids -> rows of these
    files (a function of the files: a segment's tombstones are its own);
    `ids_sorted`: how many ids were sorted to make it, all the live ones or,
    merged into the map of the version whose files these begin with
    (`prefix`: that map and its rows), those of the files added."""

    def __init__(self, columns: dict[str, pa.Array], node_files: tuple[tuple[str, str], ...], files_read: int,
                 prefix: tuple[NodeRows, int] | None = None):
        self.columns, self.node_files, self.files_read, self.prefix = columns, node_files, files_read, prefix
        self.node_row: NodeRows | None = None
        self.ids_sorted = 0


# The node columns of every version this process holds, by its node files
# ((path, sha256) in manifest order), while a loaded version holds them.
_NODE_COLUMNS: "weakref.WeakValueDictionary[tuple, NodeColumns]" = weakref.WeakValueDictionary()
_NODE_COLUMNS_LOCK = threading.Lock()


def node_files(reader: IndexReader) -> tuple[tuple[str, str], ...]:
    """The version's node files as (path, sha256), in manifest order: what
    numbers its node rows, so a version whose node files begin with another's
    numbers those rows as it does."""
    return tuple(file_named(reader, f.path) for f in reader.positions("nodes").files)


def longest_prefix(held: Iterable[tuple], files: tuple) -> tuple | None:
    """The longest of the `held` keys (files in manifest order) that `files`
    begins with, `files` itself included; None if none does."""
    return max((k for k in held if len(k) <= len(files) and files[:len(k)] == k), key=len, default=None)


def file_named(reader: IndexReader, path: str) -> tuple[str, str]:
    """A segment file of the version as (absolute path, the manifest's sha256 of it)."""
    segment = os.path.basename(os.path.dirname(path))
    files = next(s["files"] for s in reader.manifest.segments if s["id"] == segment)
    return os.path.abspath(path), files[os.path.basename(path)]["sha256"]


def node_columns(reader: IndexReader) -> NodeColumns:
    """The skeleton columns of every node row of the version. A version whose
    node files begin with those of a version this process holds (the next one
    after an update: the same segments and one more) decodes only the files it
    adds and copies the rest: a reload's Parquet reads follow the delta."""
    files = reader.positions("nodes").files
    keys = node_files(reader)
    with _NODE_COLUMNS_LOCK:
        held = _NODE_COLUMNS.get(keys)
        if held is not None:
            return held
        prefix = longest_prefix((k for k in list(_NODE_COLUMNS.keys()) if 0 < len(k) < len(keys)), keys) or ()
        base = _NODE_COLUMNS.get(prefix) if prefix else None
    done = len(prefix) if base is not None else 0
    added = skeleton_columns(pa.concat_tables([f.read(SKELETON_COLUMNS) for f in files[done:]]))
    columns = added if base is None else {
        name: pa.concat_arrays([base.columns[name], added[name]]) for name in HELD_COLUMNS}
    held_map = base.node_row if base is not None else None
    made = NodeColumns(columns, keys, len(files) - done,
                       (held_map, len(base.columns["node_id"])) if held_map is not None else None)
    with _NODE_COLUMNS_LOCK:
        _NODE_COLUMNS[keys] = made
    return made


# Each node file's live mask, by the file and its later segments' tombstones
# files ((path, sha256) each): the next version's mask of a file is this
# one's, less the ids of the one tombstones file that version adds.
_LIVE_MASKS: dict[tuple, np.ndarray] = {}
_LIVE_MASKS_KEPT = 1024  # files x the versions a process holds at once
_LIVE_MASKS_LOCK = threading.Lock()


def file_live_mask(reader: IndexReader, f: LiveFile, ids: pa.Array) -> np.ndarray:
    """`f.live_mask(ids)` for `ids`, the whole id column of `f`: made from the
    mask this process made for the version before (the same file, all its
    later tombstones files but the newest) where it holds one, so a reload
    tests the ids against the tombstones it adds, not against every id the
    index ever tombstoned (1.5 s of a 5.7 s reload at 600k pages, each version)."""
    key = (file_named(reader, f.path), tuple(file_named(reader, path) for path in f.tombstones))
    with _LIVE_MASKS_LOCK:
        mask = _LIVE_MASKS.get(key)
        before = _LIVE_MASKS.get((key[0], key[1][:-1])) if mask is None and key[1] else None
    if mask is not None:
        return mask
    if before is not None and len(before) == len(ids):
        newest = read_tombstones(f.tombstones[-1]).get(f.id_column, frozenset())
        mask = before & live_mask(ids, newest)
    else:
        mask = f.live_mask(ids)
    with _LIVE_MASKS_LOCK:
        _LIVE_MASKS[key] = mask
        while len(_LIVE_MASKS) > _LIVE_MASKS_KEPT:
            _LIVE_MASKS.pop(next(iter(_LIVE_MASKS)))
    return mask


def derive_nodes(reader: IndexReader) -> tuple[NodeColumns, NodeRows, Skeleton]:
    """(skeleton columns of every node row, live ids -> rows, the skeleton)."""
    held = node_columns(reader)
    columns = held.columns
    positions = reader.positions("nodes")
    keys = columns["node_key"].to_numpy()
    bounds = positions.file_start.tolist()  # each file's first row, and the end
    live = np.concatenate([file_live_mask(reader, f, columns["node_id"][start:end])
                           for f, start, end in zip(positions.files, bounds, bounds[1:])] or [np.zeros(0, bool)])
    if held.node_row is None:
        if held.prefix is not None:  # rows only go (tombstones accumulate) or come with the files added
            earlier, start = held.prefix
            held.node_row, held.ids_sorted = earlier.merged(live, keys, start), int(live[start:].sum())
        else:
            live_rows = np.flatnonzero(live)
            held.node_row, held.ids_sorted = NodeRows.of(keys[live_rows], live_rows), len(live_rows)
        held.prefix = None  # the earlier map is not kept alive by this one
    return held, held.node_row, Skeleton(columns, held.node_row)
