"""Loading one published version of an index for serving.

Every file is checked against the manifest's sha256 before it is used; a damaged
file is refused with an error that names it.

What every GetToC touches is held as arrays: the node skeleton (ids, parents,
ancestors, titles, optional summary and keywords, sibling positions) as Arrow
columns and numpy (`Skeleton`), the chunk -> node map, each node's chunks, the
BM25 postings with their norms (ritrag/bm25.py) and the dense shards. Bodies
and URLs, the bulk of the node table, stay on disk and are fetched by point
lookups: a node's row locates its file and row group, and only that row group
is read.

With a `cache_dir`, all of those arrays (everything but the dense shards and
the vocabulary) are derived once and saved there, then memory-mapped by every
later load (the cache's format is in `_open_cache`): a restart skips their
assembly, pages no query touches are never read, and several server processes
on one machine share one copy in the page cache instead of each holding its own.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ritrag.bm25 import Bm25, Field, Postings, field_df, parameters, row_norms, two_fields
from ritrag.representation import NODE_DOC_ORDINAL, Representation
from ritrag.layout import (BM25_STATS_FILE, IndexLayout, Manifest, dead_ids_per_segment, live_mask, parse_shard_file_name)
from ritrag.storage import is_remote
from ritrag.vectors import VectorStore
from ritrag.serving.remote import IndexMirror, default_cache_dir, mirror

LOG = logging.getLogger("ritrag.serving")

SKELETON_COLUMNS = ["node_id", "parent_id", "position", "title", "summary", "keywords", "ancestor_ids"]
RECORD_COLUMNS = ["url", "body"]  # read per node, on demand
CACHE_NAME = "arrays"  # the cache's folder per version (it held only postings, as "postings", before)
SKELETON_FILE = "skeleton.arrow"
SHAPES_FILE = "shapes.json"


class Column(Sequence):
    """Row access to an Arrow array, as Python values."""

    def __init__(self, array: pa.Array):
        self._array = array

    def __getitem__(self, row: int) -> Any:
        return self._array[row].as_py()

    def __len__(self) -> int:
        return len(self._array)


class NodeRows(Mapping):
    """Node id -> row, by binary search over the ids sorted once: a
    fixed-width bytes array takes a fraction of a dict's memory and start time
    for millions of ids, and can be memory-mapped."""

    def __init__(self, sorted_ids: np.ndarray, order: np.ndarray):
        """`sorted_ids` (fixed-width bytes, ascending) and the row of each."""
        self._sorted, self._order = sorted_ids, order
        self._width = sorted_ids.dtype.itemsize

    @classmethod
    def of(cls, ids: np.ndarray, rows: np.ndarray | None = None) -> "NodeRows":
        """The map of `ids` (bytes) held by the node rows `rows` (default: row i holds ids[i])."""
        by_id = np.argsort(ids, kind="stable")
        return cls(ids[by_id], by_id if rows is None else rows[by_id])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted ids, their rows): what `NodeRows(...)` is made of, to cache."""
        return self._sorted, self._order

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows of an array of ids (bytes); -1 where unknown."""
        if not len(self._sorted):
            return np.full(len(ids), -1, np.int64)
        pos = np.clip(np.searchsorted(self._sorted, ids), 0, len(self._sorted) - 1)
        return np.where(self._sorted[pos] == ids, self._order[pos], -1)

    def __getitem__(self, node_id: str) -> int:
        try:
            key = node_id.encode("ascii")
        except (AttributeError, UnicodeEncodeError):
            raise KeyError(node_id) from None
        # numpy compares fixed-width bytes with trailing NULs stripped and
        # would truncate a longer key, so neither may reach the search.
        if not key or len(key) > self._width or b"\0" in key:
            raise KeyError(node_id)
        row = int(self.rows(np.array([key]))[0])
        if row < 0:
            raise KeyError(node_id)
        return row

    def __iter__(self) -> Iterator[str]:
        return (k.decode("ascii") for k in self._sorted)

    def __len__(self) -> int:
        return len(self._sorted)


def _fixed_width(array: pa.Array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=object).astype(bytes)


def _columns(table: pa.Table) -> dict[str, pa.Array]:
    """The skeleton columns as single arrays; a column of one chunk (a mapped
    cache's) is used as it is, not copied by a concatenation."""
    return {name: table[name].chunk(0) if table[name].num_chunks == 1 else table[name].combine_chunks()
            for name in SKELETON_COLUMNS}


@dataclass(frozen=True)
class Skeleton:
    """Every node row as the sub-forest reads it: the skeleton columns (Arrow)
    and, resolved to live rows once, each row's parent and ancestors."""

    columns: Mapping[str, pa.Array]  # SKELETON_COLUMNS
    position: np.ndarray  # int32 place among its siblings
    parent_row: np.ndarray  # int32 live row of its parent; -1 for a root or a parent no live row holds
    ancestor_indptr: np.ndarray  # int64 (rows + 1): row r's ancestors are ancestor_rows[indptr[r]:indptr[r + 1]]
    ancestor_rows: np.ndarray  # int32 live rows of the ancestors, root first (ids no live row holds left out)

    @staticmethod
    def derive(columns: Mapping[str, pa.Array], node_row: NodeRows) -> dict[str, np.ndarray]:
        """The arrays above, from the columns and the live rows' id map."""
        parents = node_row.rows(_fixed_width(pc.fill_null(columns["parent_id"], "")))
        ancestors = columns["ancestor_ids"]
        rows = node_row.rows(_fixed_width(ancestors.flatten()))
        kept = np.concatenate([[0], np.cumsum(rows >= 0)])
        offsets = ancestors.offsets.to_numpy()
        offsets = offsets - offsets[0]  # flatten() starts at the array's first list
        return {"parent_row": parents.astype(np.int32), "ancestor_indptr": kept[offsets].astype(np.int64),
                "ancestor_rows": rows[rows >= 0].astype(np.int32)}

    @classmethod
    def of(cls, columns: Mapping[str, pa.Array], node_row: NodeRows, arrays: Mapping[str, np.ndarray] | None = None
           ) -> "Skeleton":
        arrays = cls.derive(columns, node_row) if arrays is None else arrays
        return cls(columns, columns["position"].to_numpy(), arrays["parent_row"], arrays["ancestor_indptr"],
                   arrays["ancestor_rows"])

    def ancestors(self, rows: np.ndarray) -> np.ndarray:
        """The ancestor rows of all `rows`, concatenated."""
        return self.ancestor_rows[csr_positions(self.ancestor_indptr, rows)]


def csr_positions(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions of the entries of `rows` in a CSR with `indptr`, concatenated in order."""
    counts = indptr[rows + 1] - indptr[rows]
    return np.repeat(indptr[rows] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())


class LoadedVersion:
    """One version of an index, ready for retrieval. With a `cache_dir`, the
    arrays derived at the first load are saved there and memory-mapped by
    later loads (module docstring).

    A `root` in an object store (gs://, s3://, any fsspec URL) is first
    mirrored into `cache_dir` (serving.remote: copied, verified against the
    manifest once, stamped), and the mirror is loaded like a local index."""

    def __init__(self, root: str, version: str | None = None, cache_dir: str | None = None):
        self.mirror: IndexMirror | None = None
        if is_remote(root):
            cache_dir = cache_dir or default_cache_dir()
            self.mirror = mirror(root, cache_dir)
            version = self.mirror.fetch(version)
            self.layout: IndexLayout = self.mirror.layout
        else:
            self.layout = IndexLayout(root)
        self.manifest: Manifest = self.layout.load_manifest(version)
        self.version = self.manifest.version
        self.cache_dir = cache_dir
        # Per segment, the ids that later segments (incremental updates) replaced
        # or deleted: such rows stay in the node arrays but no lookup reaches them.
        self._dead = dict(zip((seg["id"] for seg in self.manifest.segments),
                              dead_ids_per_segment(self.layout, self.manifest)))
        self.representation = Representation.from_config(self.manifest.config)
        self._index_node_files()
        vocabulary, vocabulary_df = self._load_vocabulary()
        stats = [json.load(open(f, encoding="utf-8")) for f in self._file(BM25_STATS_FILE)]
        n_chunks, n_terms = sum(s["n_chunks"] for s in stats), sum(s["n_terms"] for s in stats)
        # Without node documents, one field scored with the recorded statistics.
        one_field = Field(None, vocabulary_df, n_chunks, (n_terms / n_chunks) if n_chunks else 0.0)
        k1, b = parameters(self.manifest.config)

        cache = self._cache_path(CACHE_NAME)
        cached = _open_cache(cache, int(self._file_start[-1]), len(vocabulary)) if cache else None
        if cached is None:
            cached = self._derive(vocabulary, one_field, k1, b)
            if cache:
                _save_cache(cache, *cached)
                cached = _open_cache(cache, int(self._file_start[-1]), len(vocabulary)) or cached
        table, arrays = cached

        columns = _columns(table)
        self.node_row = NodeRows(arrays["node_sorted_ids"], arrays["node_sorted_rows"])
        self.skeleton = Skeleton.of(columns, self.node_row, arrays)
        self.nodes: dict[str, Sequence] = {name: Column(array) for name, array in columns.items()}
        self.nodes["position"] = self.skeleton.position
        self.chunk_ids, self.chunk_node = arrays["chunk_ids"], arrays["chunk_node"]
        self.chunk_is_doc = arrays["chunk_is_doc"]  # node documents, not chunks
        self.node_chunks = (arrays["node_chunk_indptr"], arrays["node_chunk_rows"])  # each node's body chunks
        self.postings = Postings({t: i for i, t in enumerate(vocabulary)}, arrays["indptr"], arrays["chunk_index"],
                                 arrays["tf"], arrays["chunk_length"])
        fields = ({"all": one_field} if not self.representation.node_docs else
                  dict(zip(("body", "doc"), two_fields(self.postings, self.chunk_is_doc, arrays["body_df"],
                                                       arrays["doc_df"]))))
        self.bm25 = Bm25(self.postings, fields, k1, b, arrays["norm"])

        self.dense_shards = self._load_dense()
        # IVF-PQ candidates are re-ranked exactly against the stored float16
        # vectors (memory-mapped) when the build asked for it (dense.json "rerank").
        self.dense_rerank = int(self.manifest.config.get("dense", {}).get("rerank", 1))
        self.vector_store = (VectorStore.open(self._files("vectors"), populate=True)
                             if self.dense_rerank > 1 else None)
        LOG.info("loaded %s: %d nodes, %d chunks, %d terms, %d postings, %d dense shards%s",
                 self.version, len(self.node_row), len(self.chunk_ids), len(self.postings.term_row),
                 len(self.postings.chunk_index), len(self.dense_shards), ", mapped from " + cache if cache else "")

    def _files(self, kind: str) -> list[str]:
        return [self.layout.verified_path(seg, name)
                for seg in self.manifest.segments for name in self.layout.segment_files(seg, kind)]

    def _file(self, name: str) -> list[str]:
        return [self.layout.verified_path(seg, name) for seg in self.manifest.segments if name in seg["files"]]

    def _live_mask(self, segment_id: str, ids: pa.ChunkedArray, kind: str) -> np.ndarray:
        return live_mask(ids, getattr(self._dead[segment_id], kind))

    def _index_node_files(self) -> None:
        """The node files and their footers: rows are the node files
        concatenated, and a row's file and row group come from these
        cumulative starts (for `node_records`)."""
        self._node_shards = self._shard_files("nodes")
        self._node_files = [path for _, path in self._node_shards]
        self._node_metadata = [pq.read_metadata(f) for f in self._node_files]
        file_rows = [md.num_rows for md in self._node_metadata]
        self._file_start = np.concatenate([[0], np.cumsum(file_rows)]).astype(np.int64)
        self._group_start = [np.concatenate([[0], np.cumsum([md.row_group(g).num_rows
                                                             for g in range(md.num_row_groups)])])
                             for md in self._node_metadata]

    def _load_vocabulary(self) -> tuple[list[str], np.ndarray]:
        """Every term (in term-row order) and its document frequency summed over segments."""
        vocabulary: list[str] = []
        df: dict[str, int] = {}
        for f in self._files("vocabulary"):
            vocab = pq.read_table(f)
            for term, n in zip(vocab["term"].to_pylist(), vocab["df"].to_pylist()):
                if term not in df:
                    vocabulary.append(term)
                df[term] = df.get(term, 0) + n
        return vocabulary, np.array([df[t] for t in vocabulary], np.int64)

    def _derive(self, vocabulary: list[str], one_field: Field, k1: float, b: float
                ) -> tuple[pa.Table, dict[str, np.ndarray]]:
        """The skeleton table and every derived array, from the version's files."""
        tables = [pq.read_table(f, columns=SKELETON_COLUMNS) for f in self._node_files]
        table = pa.concat_tables(tables).combine_chunks()
        live = np.concatenate([self._live_mask(key[0], t["node_id"], "node_ids")
                               for (key, _), t in zip(self._node_shards, tables)]) if tables else np.zeros(0, bool)
        live_rows = np.flatnonzero(live)
        columns = _columns(table)
        node_row = NodeRows.of(_fixed_width(columns["node_id"])[live_rows], live_rows)
        arrays = {**dict(zip(("node_sorted_ids", "node_sorted_rows"), node_row.arrays())),
                  **Skeleton.derive(columns, node_row)}
        chunk_arrays, chunk_shards = self._derive_chunks(node_row, table.num_rows)
        arrays.update(chunk_arrays)
        arrays.update(self._assemble_postings(pa.array(vocabulary, pa.string()), chunk_shards, arrays["chunk_ids"]))
        postings = Postings({}, arrays["indptr"], arrays["chunk_index"], arrays["tf"], arrays["chunk_length"])
        if self.representation.node_docs:
            arrays["body_df"], arrays["doc_df"] = field_df(postings, arrays["chunk_is_doc"])
            fields = two_fields(postings, arrays["chunk_is_doc"], arrays["body_df"], arrays["doc_df"])
        else:
            fields = (one_field,)
        arrays["norm"] = row_norms(postings.chunk_length, fields, k1, b)
        return table, arrays

    def _derive_chunks(self, node_row: NodeRows, n_node_rows: int
                       ) -> tuple[dict[str, np.ndarray], dict[tuple, tuple[np.ndarray, np.ndarray]]]:
        """The live chunks as arrays in chunk-id order (ids, node rows, node
        documents, each node's body chunks), and per chunk shard its ids
        sorted with their rows, to place the postings."""
        shards = self._shard_files("chunks")
        tables = [pq.read_table(path, columns=["chunk_id", "node_id", "ordinal"]) for _, path in shards]
        tables = [t.filter(self._live_mask(key[0], t["chunk_id"], "chunk_ids")) for (key, _), t in zip(shards, tables)]
        ids = np.concatenate([t["chunk_id"].to_numpy() for t in tables]) if tables else np.zeros(0, np.int64)
        order = np.argsort(ids, kind="stable")
        node_ids = pa.chunked_array([t["node_id"] for t in tables], pa.string()).combine_chunks()
        node_rows = node_row.rows(_fixed_width(node_ids)[order])
        if (node_rows < 0).any():
            raise RuntimeError(f"{self.layout.root}: chunks point at nodes the node table lacks")
        chunk_node = node_rows.astype(np.int32)
        ordinals = np.concatenate([t["ordinal"].to_numpy() for t in tables]) if tables else np.zeros(0, np.int32)
        is_doc = ordinals[order] == NODE_DOC_ORDINAL
        bodies = np.flatnonzero(~is_doc)
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
        for (key, _), table in zip(shards, tables):
            shard = slice(start, start + table.num_rows)
            start += table.num_rows
            by_id = np.argsort(ids[shard], kind="stable")
            chunk_shards[key] = (ids[shard][by_id], row_of[shard][by_id])
        return ({"chunk_ids": ids[order], "chunk_node": chunk_node, "chunk_is_doc": is_doc,
                 "node_chunk_indptr": node_chunk_indptr, "node_chunk_rows": bodies.astype(np.int32)}, chunk_shards)

    def _shard_files(self, kind: str) -> list[tuple[tuple, str]]:
        """((segment, shard, num_shards), verified path) of each shard file of `kind`."""
        return [((seg["id"], *parse_shard_file_name(name)[1:]), self.layout.verified_path(seg, name))
                for seg in self.manifest.segments for name in self.layout.segment_files(seg, kind)]

    def chunk_rows(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Rows in the chunk arrays of known chunk ids; -1 for unknown ones."""
        pos = np.searchsorted(self.chunk_ids, chunk_ids)
        pos = np.clip(pos, 0, max(len(self.chunk_ids) - 1, 0))
        found = (len(self.chunk_ids) > 0) & (self.chunk_ids[pos] == chunk_ids)
        return np.where(found, pos, -1)

    def _assemble_postings(self, terms: pa.Array, chunk_shards: dict[tuple, tuple[np.ndarray, np.ndarray]],
                           chunk_ids: np.ndarray) -> dict[str, np.ndarray]:
        """The CSR arrays of all postings shards. Each shard is sorted by term,
        so its term column is a few runs, one per distinct term: runs map to
        vocabulary rows without touching the per-posting strings, and their
        lengths place the shard's postings in the CSR without sorting."""
        def shard_runs(key: tuple, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            table = pq.read_table(path)
            table = table.filter(self._live_mask(key[0], table["chunk_id"], "chunk_ids"))
            runs = pc.run_end_encode(table["term"].combine_chunks())
            run_terms = pc.index_in(runs.values, value_set=terms)
            if run_terms.null_count:
                raise RuntimeError(f"{path}: postings of terms that the vocabulary lacks")
            ids = table["chunk_id"].to_numpy()
            shard_ids, shard_rows = chunk_shards.get(key, (chunk_ids, np.arange(len(chunk_ids))))
            pos = np.clip(np.searchsorted(shard_ids, ids), 0, max(len(shard_ids) - 1, 0))
            if len(ids) and not np.array_equal(shard_ids[pos], ids):
                raise RuntimeError(f"{path}: postings of chunks that its chunk shard lacks")
            tf = np.minimum(table["tf"].to_numpy(), np.iinfo(np.uint16).max).astype(np.uint16)
            return (run_terms.to_numpy().astype(np.int64), np.diff(runs.run_ends.to_numpy(), prepend=0),
                    shard_rows[pos].astype(np.int32), tf)

        with ThreadPoolExecutor(max_workers=2) as pool:  # numpy and Arrow release the GIL here
            shards = list(pool.map(lambda item: shard_runs(*item), self._shard_files("postings")))
        counts = np.zeros(len(terms), np.int64)
        for run_terms, lengths, _, _ in shards:
            np.add.at(counts, run_terms, lengths)
        indptr = np.zeros(len(terms) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        chunk_index = np.empty(indptr[-1], np.int32)
        tf = np.empty(indptr[-1], np.uint16)
        cursor = indptr[:-1].copy()
        for run_terms, lengths, rows, shard_tf in shards:
            run_start = np.cumsum(lengths) - lengths
            dest = np.repeat(cursor[run_terms] - run_start, lengths) + np.arange(len(rows))
            chunk_index[dest], tf[dest] = rows, shard_tf
            cursor[run_terms] += lengths
        chunk_length = np.bincount(chunk_index, weights=tf, minlength=len(chunk_ids)).astype(np.float32)
        return {"indptr": indptr, "chunk_index": chunk_index, "tf": tf, "chunk_length": chunk_length}

    def _cache_path(self, name: str) -> str | None:
        """Where arrays derived from this version's files are kept, named by
        the version and the checksums of its files, so they never go stale."""
        if not self.cache_dir:
            return None
        files = json.dumps([seg["files"] for seg in self.manifest.segments], sort_keys=True).encode()
        return os.path.join(self.cache_dir, f"{self.version}-{hashlib.sha256(files).hexdigest()[:16]}", name)

    def _load_dense(self) -> list:
        """The dense indexes to search: each segment's shards, memory-mapped
        (`read_dense_shard`), joined behind their one coarse quantizer when they
        are IVF (`segment_dense_indexes`); `dense_dead[i]`, the sorted chunk ids
        that later segments tombstoned, go with index i."""
        nprobe = int(self.manifest.config.get("dense", {}).get("nprobe", 64))
        per_segment: dict[str, list] = {}
        for (key, path) in self._shard_files("dense"):
            per_segment.setdefault(key[0], []).append(read_dense_shard(path, nprobe))
        indexes, self.dense_dead = [], []
        for segment, shards in per_segment.items():
            searched = segment_dense_indexes(shards)
            indexes += searched
            self.dense_dead += [np.array(sorted(self._dead[segment].chunk_ids), np.int64)] * len(searched)
        return indexes

    def node_records(self, rows: Sequence[int]) -> dict[int, dict[str, Any]]:
        """{"url", "body"} of the given node rows, each read from the one row
        group that holds it (a group is read once however many rows it holds)."""
        wanted: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for row in rows:
            f = int(np.searchsorted(self._file_start, row, side="right")) - 1
            in_file = row - int(self._file_start[f])
            g = int(np.searchsorted(self._group_start[f], in_file, side="right")) - 1
            wanted.setdefault((f, g), []).append((row, in_file - int(self._group_start[f][g])))
        out: dict[int, dict[str, Any]] = {}
        for (f, g), members in wanted.items():
            # A fresh reader per lookup (over the footer parsed at load) is
            # safe to use from many request threads at once.
            reader = pq.ParquetFile(self._node_files[f], metadata=self._node_metadata[f])
            group = reader.read_row_group(g, columns=RECORD_COLUMNS)
            for row, offset in members:
                out[row] = {name: group[name][offset].as_py() for name in RECORD_COLUMNS}
        return out

    def node_column(self, name: str) -> pa.Array:
        """One column of the node table for every row, in the row order of
        `nodes` (rows that later segments replaced included; `node_row`
        reaches only live ones): for batch tools that need a column of every
        node once, as evaluation needs every url."""
        tables = [pq.read_table(f, columns=[name]) for f in self._node_files]
        return pa.concat_tables(tables)[name].combine_chunks() if tables else pa.array([], pa.string())

    def page_sources(self) -> list[tuple[str, str]]:
        """(url, input source) of every indexed page, from the pages tables: the
        file or WARC record each page was read from, for tools that name pages
        by their input (an evaluation's gold written as corpus paths)."""
        tables = [pq.read_table(f, columns=["url", "source"]) for f in self._files("pages")]
        if not tables:
            return []
        table = pa.concat_tables(tables)
        return list(zip(table["url"].to_pylist(), table["source"].to_pylist()))

    def chunk_texts(self, rows: Sequence[int]) -> dict[int, str]:
        """Text of the given chunk rows, from the chunk shard files that hold
        them (each file read once, its live rows only)."""
        ids = self.chunk_ids[np.unique(np.asarray(rows, np.int64))]
        out: dict[int, str] = {}
        for key, path in self._shard_files("chunks"):
            wanted = ids[ids % key[2] == key[1]]  # a chunk's shard is its id mod the shard count
            if not len(wanted):
                continue
            table = pq.read_table(path, columns=["chunk_id", "text"], filters=[("chunk_id", "in", wanted.tolist())])
            table = table.filter(self._live_mask(key[0], table["chunk_id"], "chunk_ids"))
            found = table["chunk_id"].to_numpy()
            out.update(zip(self.chunk_rows(found).tolist(), table["text"].to_pylist()))
        return out


def _open_cache(directory: str, n_node_rows: int, n_terms: int) -> tuple[pa.Table, dict[str, np.ndarray]] | None:
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


def _save_cache(directory: str, table: pa.Table, arrays: dict[str, np.ndarray]) -> None:
    """Write the cache (`_open_cache`) into a fresh directory renamed into
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


def read_dense_shard(path: str, nprobe: int):
    """A dense shard file as a FAISS index searching `nprobe` lists.

    IO_FLAG_MMAP maps the inverted lists of IVF indexes stored as arrays (IVF-Flat,
    -SQ, -PQ) from the file instead of copying them, so processes serving one index
    share its pages; faiss 1.15 still reads the blocked lists of fast-scan indexes
    (`...x4fs`) and exact indexes into private memory (48 B of codes per vector at
    PQ96x4fs; benchmarks/RESULTS.md, "Dense search at scale").
    """
    try:
        index = faiss.read_index(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError as exc:
        raise RuntimeError(f"{path}: not a readable FAISS index ({exc})") from exc
    try:
        faiss.extract_index_ivf(index).nprobe = nprobe
    except RuntimeError:
        pass  # not an IVF index: exact search has no nprobe
    return index


def segment_dense_indexes(shards: list) -> list:
    """The shards of one segment as the indexes to search. IVF shards trained
    together (one coarse quantizer) become one `IndexShardsIVF`: a query is
    assigned to its lists once, not once per shard, and every shard scans those
    lists (the same candidates, up to the order of equal scores). Shards with
    different quantizers, or not IVF, stay as they are."""
    try:
        ivfs = [faiss.extract_index_ivf(shard) for shard in shards]
    except RuntimeError:
        return shards
    quantizers = [faiss.downcast_index(ivf.quantizer) for ivf in ivfs]
    first = ivfs[0]
    if len(shards) < 2 or not all(isinstance(q, faiss.IndexFlat) for q in quantizers) or any(
            ivf.nlist != first.nlist or ivf.nprobe != first.nprobe
            or not np.array_equal(faiss.vector_to_array(q.codes), faiss.vector_to_array(quantizers[0].codes))
            for ivf, q in zip(ivfs[1:], quantizers[1:])):
        return shards
    # The quantizer is the first shard's; faiss's add_shard keeps each shard (so
    # also that quantizer) alive as long as the joined index.
    joined = faiss.IndexShardsIVF(first.quantizer, first.nlist, False, False)
    for shard in shards:
        joined.add_shard(shard)
    return [joined]
