"""Loading one published version of an index for serving.

The version is read through an `IndexReader` (ritrag/reader.py): every file
is checked against the manifest's sha256 before it is used, a damaged file
is refused with an error that names it, and a row is live unless a later
segment tombstoned it. A root in an object store is first mirrored into the
cache directory (ritrag.serving.remote) and the mirror is read like a local
index.

What every GetToC touches is held as arrays: the node skeleton
(ritrag.serving.skeleton), the chunk -> node map, each node's chunks, the
BM25 postings with their norms and the link graph
(ritrag.serving.derived_arrays), and the dense shards
(ritrag.serving.dense_shards). Bodies and URLs, the bulk of the node
table, stay on disk and are read by position (`node_records`): only the row
group that holds a node is read.

With a `cache_dir`, the derived arrays (everything but the dense shards and
the vocabulary) are saved there once and memory-mapped by every later load
(ritrag.serving.array_cache); the first load fills the per-posting arrays
in their files, so its memory is bounded by one postings shard, not by all.
A local index's files are then stamped there once hashed (StampedLayout, as
a mirror's are), so a restart does not hash them again.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ritrag.bm25 import Bm25, Field, Postings, kind_fields, parameters
from ritrag.layout import BM25_STATS_FILE, DamagedIndexError, IndexLoadError
from ritrag.reader import IndexReader
from ritrag.storage import is_remote
from ritrag.vectors import VectorStore
from ritrag.serving.array_cache import CacheBeingWritten, cache_directory, open_cache
from ritrag.serving.dense_shards import load_dense_shards
from ritrag.serving.derived_arrays import derive_arrays, load_vocabulary
from ritrag.serving.links import LinkGraph
from ritrag.serving.remote import IndexMirror, StampedLayout, default_cache_dir, local_stamps, mirror
from ritrag.serving.skeleton import Column, NodeRows, Skeleton, skeleton_columns

LOG = logging.getLogger("ritrag.serving")

RECORD_COLUMNS = ["url", "body"]  # read per node, on demand


class LoadedVersion:
    """One version of an index, ready for retrieval: its `reader` and the
    arrays serving derives from it. With a `cache_dir`, the arrays derived at
    the first load are saved there and memory-mapped by later loads (module
    docstring).

    A `root` in an object store (gs://, s3://, any fsspec URL) is first
    mirrored into `cache_dir` (serving.remote: copied, verified against the
    manifest once, stamped), and the mirror is loaded like a local index."""

    def __init__(self, root: str, version: str | None = None, cache_dir: str | None = None):
        try:
            self._load(root, version, cache_dir)
        except (IndexLoadError, MemoryError):
            raise
        except Exception as exc:
            # Every file passed its checksum by now (or was refused with an
            # IndexLoadError), so a file that still fails to open (a FAISS
            # shard cut short, a Parquet footer that does not parse) was
            # written damaged: the version is refused like any damaged one,
            # and a server waits for a good version instead of failing.
            name = getattr(self, "version", None) or version or "CURRENT"
            raise DamagedIndexError(f"{root}: version {name} does not load ({type(exc).__name__}: {exc})") from exc

    def _load(self, root: str, version: str | None, cache_dir: str | None) -> None:
        self.mirror: IndexMirror | None = None
        if is_remote(root):
            cache_dir = cache_dir or default_cache_dir()
            self.mirror = mirror(root, cache_dir)
            self.reader = IndexReader(self.mirror.layout, self.mirror.fetch(version))
        else:
            # With a cache directory, a local index's files are hashed at the
            # first load and trusted by their stamps after (at 10M chunks,
            # hashing is 23 of a restart's 29 s).
            self.reader = IndexReader(StampedLayout(root, local_stamps(cache_dir, root)) if cache_dir else root,
                                      version)
        self.manifest = self.reader.manifest
        self.version = self.reader.version
        self.cache_dir = cache_dir
        vocabulary, vocabulary_df = load_vocabulary(self.reader)
        stats = [json.load(open(f, encoding="utf-8")) for f in self.reader.segment_files(BM25_STATS_FILE)]
        n_chunks, n_terms = sum(s["n_chunks"] for s in stats), sum(s["n_terms"] for s in stats)
        # An index of chunk bodies only: one field, scored with the recorded statistics.
        one_field = Field(None, vocabulary_df, n_chunks, (n_terms / n_chunks) if n_chunks else 0.0)
        k1, b = parameters(self.manifest.config)

        cache = cache_directory(cache_dir, self.manifest) if cache_dir else None
        n_node_rows = self.reader.positions("nodes").num_rows
        cached = open_cache(cache, n_node_rows, len(vocabulary)) if cache else None
        if cached is None and cache:
            with CacheBeingWritten(cache) as written:
                cached = derive_arrays(self.reader, vocabulary, one_field, k1, b, written.empty)
                written.commit(*cached)
            cached = open_cache(cache, n_node_rows, len(vocabulary)) or cached
        elif cached is None:
            cached = derive_arrays(self.reader, vocabulary, one_field, k1, b)
        table, arrays = cached

        columns = skeleton_columns(table)
        self.node_row = NodeRows(arrays["node_sorted_ids"], arrays["node_sorted_rows"])
        self.skeleton = Skeleton.of(columns, self.node_row, arrays)
        self.nodes: dict[str, Sequence] = {name: Column(array) for name, array in columns.items()}
        self.nodes["position"] = self.skeleton.position
        self.chunk_ids, self.chunk_node = arrays["chunk_ids"], arrays["chunk_node"]
        self.chunk_kind = arrays["chunk_kind"]  # body chunk, node document or anchor document (ritrag.bm25)
        self.node_chunks = (arrays["node_chunk_indptr"], arrays["node_chunk_rows"])  # each node's body chunks
        self.postings = Postings({t: i for i, t in enumerate(vocabulary)}, arrays["indptr"], arrays["chunk_index"],
                                 arrays["tf"], arrays["chunk_length"])
        fields = (kind_fields(self.postings, self.chunk_kind, arrays["field_df"]) if "field_df" in arrays
                  else {"all": one_field})
        self.bm25 = Bm25(self.postings, fields, k1, b, arrays["norm"])
        self.links = LinkGraph.of(arrays)

        self.dense_shards, self.dense_dead = load_dense_shards(self.reader)
        # IVF-PQ candidates are re-ranked exactly against the stored float16
        # vectors (memory-mapped) when the build asked for it (dense.json "rerank").
        self.dense_rerank = int(self.manifest.config.get("dense", {}).get("rerank", 1))
        self.vector_store = (VectorStore.open([f.path for f in self.reader.files("vectors")], populate=True)
                             if self.dense_rerank > 1 else None)
        LOG.info("loaded %s: %d nodes, %d chunks, %d terms, %d postings, %d links, %d dense shards%s",
                 self.version, len(self.node_row), len(self.chunk_ids), len(self.postings.term_row),
                 len(self.postings.chunk_index), len(self.links), len(self.dense_shards),
                 ", mapped from " + cache if cache else "")

    def chunk_rows(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Rows in the chunk arrays of known chunk ids; -1 for unknown ones."""
        pos = np.searchsorted(self.chunk_ids, chunk_ids)
        pos = np.clip(pos, 0, max(len(self.chunk_ids) - 1, 0))
        found = (len(self.chunk_ids) > 0) & (self.chunk_ids[pos] == chunk_ids)
        return np.where(found, pos, -1)

    def node_records(self, rows: Sequence[int]) -> dict[int, dict[str, Any]]:
        """{"url", "body"} of the given node rows, each read from the one row
        group that holds it (a group is read once however many rows it holds)."""
        return self.reader.positions("nodes").read(rows, RECORD_COLUMNS)
