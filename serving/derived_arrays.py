"""The node-side arrays a server derives from one version's node and edge
files: the skeleton table with its id map and resolved parents and
ancestors, and the link graph between node rows (ritrag.serving.links).
The chunk-side arrays and the postings are the segments' own serving files
(ritrag.serving.segments), mapped, not derived.

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

import numpy as np
import pyarrow as pa

from ritrag.schema import EDGES_KIND
from ritrag.reader import IndexReader
from ritrag.serving.skeleton import SKELETON_COLUMNS, NodeRows, Skeleton, skeleton_columns
from ritrag.serving_form import utf8_fixed_width


class NodeColumns:
    """The skeleton columns of a list of node files, one array each (a query
    takes rows from one array; from chunked arrays Arrow would concatenate them
    at every take). `files_read`: how many of those files were decoded to make
    it, the others' rows copied from an earlier version's (`node_columns`)."""

    def __init__(self, columns: dict[str, pa.Array], files_read: int):
        self.columns, self.files_read = columns, files_read


# The node columns of every version this process holds, by its node files
# ((path, sha256) in manifest order), while a loaded version holds them.
_NODE_COLUMNS: "weakref.WeakValueDictionary[tuple, NodeColumns]" = weakref.WeakValueDictionary()
_NODE_COLUMNS_LOCK = threading.Lock()


def node_columns(reader: IndexReader) -> NodeColumns:
    """The skeleton columns of every node row of the version. A version whose
    node files begin with those of a version this process holds (the next one
    after an update: the same segments and one more) decodes only the files it
    adds and copies the rest: a reload's Parquet reads follow the delta."""
    by_id = {segment["id"]: segment for segment in reader.manifest.segments}
    files = reader.positions("nodes").files
    keys = tuple((os.path.abspath(f.path), by_id[f.segment]["files"][os.path.basename(f.path)]["sha256"])
                 for f in files)
    with _NODE_COLUMNS_LOCK:
        held = _NODE_COLUMNS.get(keys)
        if held is not None:
            return held
        prefix = max((k for k in list(_NODE_COLUMNS.keys()) if 0 < len(k) < len(keys) and keys[:len(k)] == k),
                     key=len, default=())
        base = _NODE_COLUMNS.get(prefix) if prefix else None
    done = len(prefix) if base is not None else 0
    added = pa.concat_tables([f.read(SKELETON_COLUMNS) for f in files[done:]]).combine_chunks()
    columns = skeleton_columns(added) if base is None else {
        name: pa.concat_arrays([base.columns[name], *added[name].chunks]) for name in SKELETON_COLUMNS}
    made = NodeColumns(columns, len(files) - done)
    with _NODE_COLUMNS_LOCK:
        _NODE_COLUMNS[keys] = made
    return made


def derive_nodes(reader: IndexReader) -> tuple[NodeColumns, NodeRows, Skeleton]:
    """(skeleton columns of every node row, live ids -> rows, the skeleton)."""
    held = node_columns(reader)
    columns = held.columns
    positions = reader.positions("nodes")
    ids = utf8_fixed_width(columns["node_id"])
    bounds = positions.file_start.tolist()  # each file's first row, and the end
    live = np.concatenate([f.live_mask(columns["node_id"][start:end])
                           for f, start, end in zip(positions.files, bounds, bounds[1:])] or [np.zeros(0, bool)])
    live_rows = np.flatnonzero(live)
    node_row = NodeRows.of(ids[live_rows], live_rows)
    return held, node_row, Skeleton(columns, node_row)


def derive_links(reader: IndexReader, node_row: NodeRows, n_node_rows: int) -> dict[str, np.ndarray]:
    """The live edges between live node rows as two CSRs over node rows:
    each row's out-links (`link_out_indptr`, `link_out_rows`) and in-links
    (`link_in_indptr`, `link_in_rows`), each edge once however many links of
    its source name its target, a node's links to itself left out, targets
    ascending. An edge whose target no live row holds (its page removed by a
    later segment) is left out too."""
    tables = [f.table(["source_node_id", "target_node_id"]) for f in reader.files(EDGES_KIND)]
    if tables:
        edges = pa.concat_tables(tables)
        source = node_row.rows(utf8_fixed_width(edges["source_node_id"].combine_chunks()))
        target = node_row.rows(utf8_fixed_width(edges["target_node_id"].combine_chunks()))
        keep = (source >= 0) & (target >= 0) & (source != target)
        pairs = np.unique(source[keep] * n_node_rows + target[keep])
    else:
        pairs = np.zeros(0, np.int64)
    source, target = np.divmod(pairs, max(n_node_rows, 1))
    out = {}
    for name, rows, other in (("out", source, target), ("in", target, source)):
        order = np.lexsort((other, rows))
        indptr = np.zeros(n_node_rows + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=n_node_rows), out=indptr[1:])
        out[f"link_{name}_indptr"], out[f"link_{name}_rows"] = indptr, other[order].astype(np.int32)
    return out
