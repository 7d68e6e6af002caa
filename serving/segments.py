"""A version's chunks and BM25 postings over its segments' serving files
(ritrag/serving_form.py), mapped as the jobs wrote them.

A serving file is mapped once per process, however many loaded versions
name it (`mapped_shard`): the next version maps only the segments it adds,
and the rest of its load is one vectorized pass over the per-chunk arrays
(which rows are live, each row's node row, the length norms), not over the
postings. A query looks each of its terms up in every shard of every
segment (`SegmentedPostings.of`) and takes df from every segment's
vocabulary (`FieldDf`), so statistics stay global to the version and exact.

Rows. A version's chunk rows are its shards' rows one after the other, in
manifest order (segments) then shard order, each shard's rows in chunk-id
order; rows that a later segment tombstoned stay, marked dead (`live`), so
no array is rebuilt when one more segment arrives.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ritrag.bm25 import BODY, KIND_FIELDS, Field
from ritrag.ids import shard_of
from ritrag.layout import DamagedIndexError, IndexLoadError
from ritrag.reader import IndexReader, LiveFile
from ritrag.serving_form import (IN_LINK_ARRAYS, LINK_ARRAYS, LINK_COLUMNS, OUT_LINK_ARRAYS, SERVING_KIND, link_arrays,
                                 map_arrays, table_link_ids)
from ritrag.serving.derived_arrays import longest_prefix
from ritrag.serving.skeleton import NodeRows

LOG = logging.getLogger("ritrag.serving")

# What a serving file must hold, by name: the dtype kind and the number of dimensions.
ARRAY_SHAPES = {"chunk_ids": ("i", 1), "chunk_kind": ("i", 1), "chunk_length": ("f", 1), "chunk_node": ("i", 1),
                "chunk_node_id": ("S", 1), "terms": ("S", 1), "indptr": ("i", 1), "rows": ("i", 1),
                "tf": ("u", 1), "vocab_terms": ("S", 1), "vocab_df": ("i", 2)}
_NO_ARRAY = np.zeros(0, np.int8)  # what `links` reads of an array a file does not hold
# The link arrays come in pairs of equal length (a file may predate either pair).
_LINK_PAIRS = (OUT_LINK_ARRAYS, IN_LINK_ARRAYS, LINK_ARRAYS[2:])


class MappedShard:
    """One serving file, mapped, its arrays checked to fit together (a file
    that matches its checksum and does not is refused as damaged)."""

    def __init__(self, path: str):
        self.path = path
        arrays = map_arrays(path)
        for name, (kind, ndim) in ARRAY_SHAPES.items():
            if name not in arrays or arrays[name].dtype.kind != kind or arrays[name].ndim != ndim:
                raise DamagedIndexError(f"{path}: no array {name!r} of the serving form")
        n_chunks, n_terms = len(arrays["chunk_ids"]), len(arrays["terms"])
        indptr, rows = arrays["indptr"], arrays["rows"]
        fits = (all(len(arrays[n]) == n_chunks for n in ("chunk_kind", "chunk_length", "chunk_node", "chunk_node_id"))
                and len(indptr) == n_terms + 1 and indptr[0] == 0 and indptr[-1] == len(rows) == len(arrays["tf"])
                and arrays["vocab_df"].shape == (len(arrays["vocab_terms"]), len(KIND_FIELDS))
                and all(arrays.get(a, _NO_ARRAY).shape == arrays.get(b, _NO_ARRAY).shape for a, b in _LINK_PAIRS))
        if not fits:
            raise DamagedIndexError(f"{path}: its serving arrays do not fit together")
        self.arrays = arrays
        self.n_chunks = n_chunks
        self._links: dict[str, np.ndarray] | None = None
        self._links_lock = threading.Lock()
        # (chunk rows whose node is not where the segment wrote it, their node
        # rows) as the last versions loaded resolved them, by those versions'
        # node files ((path, sha256) in manifest order): VersionChunks.
        self.node_rows: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def links(self, edges: LiveFile) -> tuple[dict[str, np.ndarray], bool]:
        """(the shard's link arrays, whether its in-links are those of the
        targets it owns): OUT_LINK_ARRAYS + IN_LINK_ARRAYS as the file holds
        them (True), or, from a file written before the in-links were sharded
        by target, LINK_ARRAYS (False): as it holds them, made keys once per
        process from a file written before node keys, or derived from `edges`
        (its version's edges file of this shard) where it has none."""
        if all(self.arrays.get(name, _NO_ARRAY).dtype == np.uint64 for name in OUT_LINK_ARRAYS + IN_LINK_ARRAYS):
            return self.arrays, True
        if all(self.arrays.get(name, _NO_ARRAY).dtype == np.uint64 for name in LINK_ARRAYS):
            return self.arrays, False
        with self._links_lock:
            if self._links is None:
                self._links = (link_arrays(self.arrays["link_out_source"], self.arrays["link_out_target"])
                               if all(name in self.arrays for name in LINK_ARRAYS)
                               else link_arrays(*table_link_ids(edges.read(LINK_COLUMNS))))
            return self._links, False

    def term_range(self, key: bytes) -> tuple[int, int]:
        """The entries of the postings of `key` (UTF-8 term), (0, 0) if none."""
        i = _position(self.arrays["terms"], key)
        indptr = self.arrays["indptr"]
        return (0, 0) if i is None else (int(indptr[i]), int(indptr[i + 1]))

    def vocab_df(self, key: bytes) -> np.ndarray | None:
        """The term's df per field in the whole segment, None if not listed."""
        i = _position(self.arrays["vocab_terms"], key)
        return None if i is None else self.arrays["vocab_df"][i]


def _position(terms: np.ndarray, key: bytes) -> int | None:
    """The row of `key` in sorted fixed-width `terms`, None if absent."""
    # numpy compares fixed-width bytes with trailing NULs stripped and would
    # truncate a longer key: a key longer than the width is in no row.
    if len(key) > terms.dtype.itemsize:
        return None
    i = int(np.searchsorted(terms, key))
    return i if i < len(terms) and terms[i] == key else None


def term_key(term: str) -> bytes | None:
    """A term as the serving files hold it (UTF-8); None for a string that is
    no UTF-8 text (a lone surrogate), which no indexed term is."""
    try:
        return term.encode("utf-8")
    except UnicodeEncodeError:
        return None


# Every serving file mapped by this process, while some loaded version holds it.
_MAPPED: "weakref.WeakValueDictionary[tuple[str, str], MappedShard]" = weakref.WeakValueDictionary()
_MAPPED_LOCK = threading.Lock()


def mapped_shard(path: str, sha256: str) -> MappedShard:
    """The process's mapping of a serving file (keyed by its path and the
    manifest's checksum of it), mapping it only if no loaded version has."""
    key = (os.path.abspath(path), sha256)
    with _MAPPED_LOCK:
        shard = _MAPPED.get(key)
        if shard is None:
            shard = MappedShard(path)
            _MAPPED[key] = shard
        return shard


@dataclass(frozen=True)
class SegmentShards:
    """One segment's mapped shards, in shard order."""

    segment: str
    shards: list[MappedShard]


def version_shards(reader: IndexReader) -> list[SegmentShards]:
    """Every segment's serving files, verified and mapped (shared with other loaded versions)."""
    out = []
    for segment in reader.manifest.segments:
        names = reader.layout.segment_files(segment, SERVING_KIND)
        if not names:
            raise IndexLoadError(f"{reader.layout.segment_dir(segment['id'])}: written by an older ritrag (index "
                                 f"format 2), without the serving form a server maps: run `ritrag compact "
                                 f"{reader.layout.root}` once to serve this index")
        if len(names) != segment["num_shards"]:
            raise DamagedIndexError(f"{reader.layout.segment_dir(segment['id'])}: {len(names)} serving files for "
                                    f"{segment['num_shards']} shards")
        out.append(SegmentShards(segment["id"], [
            mapped_shard(reader.verified_path(segment, name), segment["files"][name]["sha256"]) for name in names]))
    return out


class VersionChunks:
    """A version's chunk rows (module docstring): ids, fields, BM25 lengths,
    node rows and which are live, as arrays over all its shards' rows.
    `node_starts`: per segment, the node row of its first node (node rows
    are ritrag.reader.RowPositions')."""

    def __init__(self, reader: IndexReader, segments: list[SegmentShards], node_starts: list[int],
                 node_row: NodeRows, n_node_rows: int, node_files: tuple[tuple[str, str], ...]):
        self.shards = [shard for seg in segments for shard in seg.shards]
        self._shards_per_segment = [len(seg.shards) for seg in segments]
        self.starts = np.concatenate([[0], np.cumsum([shard.n_chunks for shard in self.shards])]).astype(np.int64)
        self.chunk_ids = _concat([shard.arrays["chunk_ids"] for shard in self.shards], np.int64)
        self.chunk_kind = _concat([shard.arrays["chunk_kind"] for shard in self.shards], np.int8)
        self.chunk_length = _concat([shard.arrays["chunk_length"] for shard in self.shards], np.float32)
        live = np.ones(len(self.chunk_ids), bool)
        node = np.empty(len(self.chunk_ids), np.int64)
        i = 0
        for seg, node_start in zip(segments, node_starts):
            dead = reader.dead[seg.segment].get("chunk_id", frozenset())
            dead_ids = np.fromiter(dead, np.int64, len(dead))
            for shard in seg.shards:
                rows = slice(self.starts[i], self.starts[i + 1])
                if len(dead_ids):
                    live[rows] = ~np.isin(self.chunk_ids[rows], dead_ids)
                local = shard.arrays["chunk_node"].astype(np.int64)
                node[rows] = np.where(local >= 0, local + node_start, -1)
                i += 1
        # A row whose node is in another segment, or whose node row a later
        # segment replaced, is resolved by its node id: as many rows as the
        # later segments changed, not the whole index. A row a version this
        # process loaded resolved keeps that node row while it is live (the
        # version's node files begin with that version's, so its rows number
        # the same; a live row is the one row of its id): a reload resolves
        # the rows whose node the new version re-placed. (-1 indexes the last
        # slot, which no node row is.)
        live_node = np.zeros(n_node_rows + 1, bool)
        live_node[node_row.arrays()[1]] = True
        stale = live & ~live_node[node]
        for i, shard in enumerate(self.shards):
            stale_rows = rows = np.flatnonzero(stale[self.starts[i]:self.starts[i + 1]])
            earlier = longest_prefix(list(shard.node_rows), node_files)
            if len(rows) and earlier is not None:
                held_rows, held_nodes = shard.node_rows[earlier]
                at = np.minimum(np.searchsorted(held_rows, rows), max(len(held_rows) - 1, 0))
                held = np.where(held_rows[at] == rows, held_nodes[at], -1) if len(held_rows) else np.full(len(rows), -1)
                still = live_node[held]
                node[rows[still] + self.starts[i]] = held[still]
                rows = rows[~still]
            if len(rows):
                node[rows + self.starts[i]] = node_row.rows(shard.arrays["chunk_node_id"][rows])
            shard.node_rows[node_files] = (stale_rows, node[stale_rows + self.starts[i]].astype(np.int32))
            while len(shard.node_rows) > _NODE_ROWS_KEPT:
                shard.node_rows.pop(next(iter(shard.node_rows)))
        if (node[live] < 0).any():
            raise DamagedIndexError(f"{reader.layout.root}: chunks point at nodes the node table lacks")
        self.chunk_node = np.where(live, node, 0).astype(np.int32)
        self.live = live

    def rows_of(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Live rows of chunk ids, -1 for ids no live row holds. An id is
        looked for in each segment only in the shard that owns it."""
        chunk_ids = np.asarray(chunk_ids, np.int64)
        found = np.full(len(chunk_ids), -1, np.int64)
        first = 0
        for count in self._shards_per_segment:
            owner = chunk_ids % count
            for local in np.unique(owner[found < 0]):
                i = first + int(local)
                asked = np.flatnonzero((found < 0) & (owner == local))
                ids = self.shards[i].arrays["chunk_ids"]
                if not len(ids):
                    continue
                pos = np.minimum(np.searchsorted(ids, chunk_ids[asked]), len(ids) - 1)
                rows = pos + self.starts[i]
                hit = (ids[pos] == chunk_ids[asked]) & self.live[rows]
                found[asked[hit]] = rows[hit]
            first += count
        return found


_NODE_ROWS_KEPT = 2  # versions whose chunk -> node rows a shard keeps: the live one and the next


def _concat(arrays: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


class SegmentedPostings:
    """`ritrag.bm25.TermPostings` over a version's mapped shards: a term's
    live postings from every shard that holds it, as version rows."""

    def __init__(self, chunks: VersionChunks):
        self._chunks = chunks
        self.chunk_length = chunks.chunk_length

    def __len__(self) -> int:
        """The number of postings mapped, dead rows' included."""
        return sum(len(shard.arrays["rows"]) for shard in self._chunks.shards)

    def of(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        key = term_key(term)
        rows, tfs = [], []
        for start, shard in zip(self._chunks.starts, self._chunks.shards):
            lo, hi = shard.term_range(key) if key is not None else (0, 0)
            if hi > lo:
                rows.append(shard.arrays["rows"][lo:hi] + start)
                tfs.append(shard.arrays["tf"][lo:hi])
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.uint16)
        rows, tf = np.concatenate(rows), np.concatenate(tfs)
        keep = self._chunks.live[rows]
        return rows[keep], tf[keep]

    def tf_at(self, term: str, rows: np.ndarray) -> np.ndarray:
        out = np.zeros(len(rows), np.uint16)
        key = term_key(term)
        if key is None or not len(rows):
            return out
        starts = self._chunks.starts
        # the rows of each shard are a slice of the ascending rows asked
        bounds = np.searchsorted(rows, starts)
        for i, shard in enumerate(self._chunks.shards):
            first, last = bounds[i], bounds[i + 1]
            lo, hi = shard.term_range(key) if last > first else (0, 0)
            if hi <= lo:
                continue
            local = rows[first:last] - starts[i]
            postings = shard.arrays["rows"][lo:hi]
            at = np.minimum(np.searchsorted(postings, local), hi - lo - 1)
            hit = postings[at] == local
            out[first:last][hit] = shard.arrays["tf"][lo:hi][at[hit]]
        return out


class FieldDf:
    """`ritrag.bm25.TermCounts`: a field's df of a term (None: all fields),
    summed over the vocabularies of a version's segments. A term is looked
    for in each segment only in the vocabulary shard its hash names."""

    def __init__(self, segments: list[SegmentShards], kind: int | None):
        self._segments, self._kind = segments, kind

    def get(self, term: str, default: int = 0) -> int:
        key = term_key(term)
        if key is None:
            return default
        total = 0
        for seg in self._segments:
            df = seg.shards[shard_of(term, len(seg.shards))].vocab_df(key)
            if df is not None:
                total += int(df.sum() if self._kind is None else df[self._kind])
        return total if total > 0 else default


def version_fields(segments: list[SegmentShards], chunks: VersionChunks, recorded_n: int, recorded_terms: int
                   ) -> dict[str, Field]:
    """The BM25 fields of a version (ritrag/bm25.py, "Fields"): one field
    "all" scored with the recorded statistics when every live row is a chunk
    body, else one per kind of row it holds, N and mean length from the live rows."""
    kind = chunks.chunk_kind
    live = chunks.live
    if not (kind[live] != BODY).any():
        return {"all": Field(None, FieldDf(segments, None), recorded_n,
                             (recorded_terms / recorded_n) if recorded_n else 0.0)}
    fields = {}
    for k, name in enumerate(KIND_FIELDS):
        member = live & (kind == k)
        n = int(member.sum())
        if n or k == BODY:
            fields[name] = Field(member, FieldDf(segments, k), n,
                                 float(chunks.chunk_length[member].sum(dtype=np.float64) / n) if n else 0.0)
    return fields


def node_chunks(chunks: VersionChunks, n_node_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr over node rows, body chunk rows): each live node's live body
    chunks, in chunk-id order."""
    bodies = np.flatnonzero(chunks.live & (chunks.chunk_kind == BODY))
    bodies = bodies[np.lexsort((chunks.chunk_ids[bodies], chunks.chunk_node[bodies]))]
    indptr = np.zeros(n_node_rows + 1, np.int64)
    np.cumsum(np.bincount(chunks.chunk_node[bodies], minlength=n_node_rows), out=indptr[1:])
    return indptr, bodies.astype(np.int32)
