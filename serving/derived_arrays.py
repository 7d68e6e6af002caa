"""The arrays a server derives from one version's files: the node skeleton
table with its id map and resolved parents and ancestors, the live chunks
(ids, node rows, row kinds, each node's body chunks), the BM25 postings as
one CSR with their norms (ritrag/bm25.py) and the link graph between node
rows (ritrag.serving.links).

Rows are read through the version's `IndexReader`; the rule of which rows
are live is the reader's. Node rows keep the position of every row of the
node files (`RowPositions`), dead ones included, so that a body is read by
position; no id maps to a dead row. The arrays are what
ritrag.serving.array_cache saves and maps.
"""
from __future__ import annotations


import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ritrag.bm25 import ANCHORS, BODY, DOC, Field, Postings, kind_df, kind_fields, row_norms
from ritrag.layout import EDGES_KIND
from ritrag.reader import IndexReader, LiveFile
from ritrag.representation import ANCHOR_DOC_ORDINAL, NODE_DOC_ORDINAL
from ritrag.serving.array_cache import Allocate, in_memory
from ritrag.serving.skeleton import SKELETON_COLUMNS, NodeRows, Skeleton, fixed_width, skeleton_columns

ShardKey = tuple[str, int, int]  # (segment, shard, number of shards) of a shard file


def shard_key(live_file: LiveFile) -> ShardKey:
    return live_file.segment, live_file.shard, live_file.num_shards


def load_vocabulary(reader: IndexReader) -> tuple[list[str], np.ndarray]:
    """Every term (in term-row order) and its document frequency summed over segments."""
    vocabulary: list[str] = []
    df: dict[str, int] = {}
    for f in reader.files("vocabulary"):
        vocab = f.read()
        for term, n in zip(vocab["term"].to_pylist(), vocab["df"].to_pylist()):
            if term not in df:
                vocabulary.append(term)
            df[term] = df.get(term, 0) + n
    return vocabulary, np.array([df[t] for t in vocabulary], np.int64)


def derive_arrays(reader: IndexReader, vocabulary: list[str], one_field: Field, k1: float, b: float,
                  empty: Allocate = in_memory) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """The skeleton table and every derived array, from the version's files.
    An index of chunk bodies only is scored in `one_field`; one with node or
    anchor documents has a field per row kind (`field_df`, ritrag.bm25).
    `empty` allocates the arrays of one item per posting (the cache's
    files when there is a cache: ritrag.serving.array_cache)."""
    node_files = reader.positions("nodes").files
    tables = [f.read(SKELETON_COLUMNS) for f in node_files]
    table = pa.concat_tables(tables).combine_chunks()
    live = (np.concatenate([f.live_mask(t["node_id"]) for f, t in zip(node_files, tables)]) if tables
            else np.zeros(0, bool))
    live_rows = np.flatnonzero(live)
    columns = skeleton_columns(table)
    node_row = NodeRows.of(fixed_width(columns["node_id"])[live_rows], live_rows)
    arrays = {**dict(zip(("node_sorted_ids", "node_sorted_rows"), node_row.arrays())),
              **Skeleton.derive(columns, node_row)}
    chunk_arrays, chunk_shards = derive_chunks(reader, node_row, table.num_rows)
    arrays.update(chunk_arrays)
    arrays.update(assemble_postings(reader, pa.array(vocabulary, pa.string()), chunk_shards, arrays["chunk_ids"],
                                    empty))
    postings = Postings({}, arrays["indptr"], arrays["chunk_index"], arrays["tf"], arrays["chunk_length"])
    if (arrays["chunk_kind"] != BODY).any():
        arrays["field_df"] = kind_df(postings, arrays["chunk_kind"])
        fields = list(kind_fields(postings, arrays["chunk_kind"], arrays["field_df"]).values())
    else:
        fields = [one_field]
    arrays["norm"] = row_norms(postings.chunk_length, fields, k1, b)
    arrays.update(derive_links(reader, node_row, table.num_rows))
    return table, arrays


def derive_chunks(reader: IndexReader, node_row: NodeRows, n_node_rows: int
                  ) -> tuple[dict[str, np.ndarray], dict[ShardKey, tuple[np.ndarray, np.ndarray]]]:
    """The live chunks as arrays in chunk-id order (ids, node rows, row kinds
    as ritrag.bm25 numbers them, each node's body chunks), and per chunk
    shard its ids sorted with their rows, to place the postings."""
    shards = reader.files("chunks")
    tables = [f.table(["chunk_id", "node_id", "ordinal"]) for f in shards]
    ids = np.concatenate([t["chunk_id"].to_numpy() for t in tables]) if tables else np.zeros(0, np.int64)
    order = np.argsort(ids, kind="stable")
    node_ids = pa.chunked_array([t["node_id"] for t in tables], pa.string()).combine_chunks()
    node_rows = node_row.rows(fixed_width(node_ids)[order])
    if (node_rows < 0).any():
        raise RuntimeError(f"{reader.layout.root}: chunks point at nodes the node table lacks")
    chunk_node = node_rows.astype(np.int32)
    ordinals = np.concatenate([t["ordinal"].to_numpy() for t in tables]) if tables else np.zeros(0, np.int32)
    ordinals = ordinals[order]
    kind = np.full(len(ordinals), BODY, np.int8)
    kind[ordinals == NODE_DOC_ORDINAL] = DOC
    kind[ordinals == ANCHOR_DOC_ORDINAL] = ANCHORS
    bodies = np.flatnonzero(kind == BODY)
    bodies = bodies[np.argsort(chunk_node[bodies], kind="stable")]
    node_chunk_indptr = np.zeros(n_node_rows + 1, np.int64)
    np.cumsum(np.bincount(chunk_node[bodies], minlength=n_node_rows), out=node_chunk_indptr[1:])
    # Per chunk shard, its ids sorted and their rows: a postings shard holds
    # the chunks of the chunk shard of the same number, and a search in a
    # shard's ids stays in the CPU cache where one in all ids would not.
    row_of = np.empty(len(ids), np.int64)
    row_of[order] = np.arange(len(ids))
    start = 0
    chunk_shards = {}
    for f, table in zip(shards, tables):
        shard = slice(start, start + table.num_rows)
        start += table.num_rows
        by_id = np.argsort(ids[shard], kind="stable")
        chunk_shards[shard_key(f)] = (ids[shard][by_id], row_of[shard][by_id])
    return ({"chunk_ids": ids[order], "chunk_node": chunk_node, "chunk_kind": kind,
             "node_chunk_indptr": node_chunk_indptr, "node_chunk_rows": bodies.astype(np.int32)}, chunk_shards)


def assemble_postings(reader: IndexReader, terms: pa.Array,
                      chunk_shards: dict[ShardKey, tuple[np.ndarray, np.ndarray]], chunk_ids: np.ndarray,
                      empty: Allocate = in_memory) -> dict[str, np.ndarray]:
    """The CSR arrays of all postings shards. Each shard is sorted by term,
    so its term column is a few runs, one per distinct term: runs map to
    vocabulary rows without touching the per-posting strings, and their
    lengths place the shard's postings in the CSR without sorting. Two passes,
    one shard's columns in memory at a time: the first counts each term's
    postings from the shards' runs, the second reads chunk ids and term
    frequencies and places them. Holding every shard's columns at once cost
    more than 23 GiB at 10M chunks (1.2 billion postings); this holds one
    shard, and the CSR's per-posting arrays where `empty` puts them. Chunk
    lengths are summed shard by shard too: one bincount over all postings
    would widen them to 8-byte copies (19 GiB at 10M)."""
    files = reader.files("postings")
    runs_of_shards = []
    for f in files:
        runs = pc.run_end_encode(f.table(["term"])["term"].combine_chunks())
        run_terms = pc.index_in(runs.values, value_set=terms)
        if run_terms.null_count:
            raise RuntimeError(f"{f.path}: postings of terms that the vocabulary lacks")
        runs_of_shards.append((run_terms.to_numpy().astype(np.int64), np.diff(runs.run_ends.to_numpy(), prepend=0)))
    counts = np.zeros(len(terms), np.int64)
    for run_terms, lengths in runs_of_shards:
        np.add.at(counts, run_terms, lengths)
    indptr = np.zeros(len(terms) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    chunk_index = empty("chunk_index", int(indptr[-1]), np.int32)
    tf = empty("tf", int(indptr[-1]), np.uint16)
    chunk_length = np.zeros(len(chunk_ids), np.float64)
    cursor = indptr[:-1].copy()
    for f, (run_terms, lengths) in zip(files, runs_of_shards):
        table = f.table(["chunk_id", "tf"])
        ids = table["chunk_id"].to_numpy()
        shard_ids, shard_rows = chunk_shards.get(shard_key(f), (chunk_ids, np.arange(len(chunk_ids))))
        pos = np.clip(np.searchsorted(shard_ids, ids), 0, max(len(shard_ids) - 1, 0))
        if len(ids) and not np.array_equal(shard_ids[pos], ids):
            raise RuntimeError(f"{f.path}: postings of chunks that its chunk shard lacks")
        run_start = np.cumsum(lengths) - lengths
        dest = np.repeat(cursor[run_terms] - run_start, lengths) + np.arange(len(ids))
        rows = shard_rows[pos]
        shard_tf = np.minimum(table["tf"].to_numpy(), np.iinfo(np.uint16).max)
        chunk_index[dest], tf[dest] = rows, shard_tf
        chunk_length += np.bincount(rows, weights=shard_tf, minlength=len(chunk_ids))
        cursor[run_terms] += lengths
        del table, ids, pos, dest, rows, shard_tf  # before the next shard is read, not after
    return {"indptr": indptr, "chunk_index": chunk_index, "tf": tf, "chunk_length": chunk_length.astype(np.float32)}


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
        source = node_row.rows(fixed_width(edges["source_node_id"].combine_chunks()))
        target = node_row.rows(fixed_width(edges["target_node_id"].combine_chunks()))
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
