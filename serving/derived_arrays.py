"""The node-side arrays a server derives from one version's node and edge
files: the skeleton table with its id map and resolved parents and
ancestors, and the link graph between node rows (ritrag.serving.links).
The chunk-side arrays and the postings are the segments' own serving files
(ritrag.serving.segments), mapped, not derived.

Rows are read through the version's `IndexReader`; the rule of which rows
are live is the reader's. Node rows keep the position of every row of the
node files (`RowPositions`), dead ones included, so that a body is read by
position; no id maps to a dead row.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ritrag.schema import EDGES_KIND
from ritrag.reader import IndexReader
from ritrag.serving.skeleton import SKELETON_COLUMNS, NodeRows, Skeleton, skeleton_columns
from ritrag.serving_form import utf8_fixed_width


def derive_nodes(reader: IndexReader) -> tuple[dict[str, pa.Array], NodeRows, Skeleton]:
    """(skeleton columns of every node row, live ids -> rows, the skeleton
    with parents and ancestors resolved to live rows)."""
    node_files = reader.positions("nodes").files
    tables = [f.read(SKELETON_COLUMNS) for f in node_files]
    columns = skeleton_columns(pa.concat_tables(tables).combine_chunks())
    live = np.concatenate([f.live_mask(t["node_id"]) for f, t in zip(node_files, tables)])
    live_rows = np.flatnonzero(live)
    node_row = NodeRows.of(utf8_fixed_width(columns["node_id"])[live_rows], live_rows)
    return columns, node_row, Skeleton.of(columns, node_row)


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
