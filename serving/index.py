"""Loading one published version of an index for serving.

The version is read through an `IndexReader` (ritrag/reader.py): every file
is checked against the manifest's sha256 before it is used, a damaged file
is refused with an error that names it, and a row is live unless a later
segment tombstoned it. A root in an object store is first mirrored into the
cache directory (ritrag.serving.remote) and the mirror is read like a local
index.

What every GetToC touches is held as arrays. The BM25 postings and the
chunk rows are each segment's serving files (ritrag/serving_form.py), mapped
as written and shared with every other loaded version that names the same
segment (ritrag.serving.segments): a new version maps only the segments it
adds. The version's own arrays, the chunks' node rows and which are live,
the fields' statistics, the node skeleton (ritrag.serving.skeleton) and the
link graph (ritrag.serving.derived_arrays), are derived at each load from
the per-chunk arrays and the node and edge files, never from the postings;
of the node files, a version decodes only those that no version this process
holds has decoded before it (`derived_arrays.node_columns`).
The dense shards are ritrag.serving.dense_shards'. Bodies and URLs, the bulk
of the node table, stay on disk and are read by position (`node_records`):
only the row group that holds a node is read.

A file is hashed against the manifest once per process (ritrag/layout.py);
with a `cache_dir`, a local index's files are also stamped there once hashed
(StampedLayout, as a mirror's are), so a restart does not hash them again.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ritrag.bm25 import Bm25
from ritrag.layout import BM25_STATS_FILE, DamagedIndexError, IndexLoadError
from ritrag.schema import EDGES_KIND
from ritrag.reader import IndexReader
from ritrag.storage import is_remote
from ritrag.serving_form import SERVING_KIND
from ritrag.vectors import VECTORS_KIND, VectorStore
from ritrag.serving.dense_shards import load_dense_shards
from ritrag.serving.derived_arrays import derive_nodes
from ritrag.serving.links import LinkGraph
from ritrag.serving.root_prior import RootPrior
from ritrag.serving.remote import IndexMirror, StampedLayout, default_cache_dir, local_stamps, mirror
from ritrag.serving.segments import SegmentedPostings, VersionChunks, node_chunks, version_fields, version_shards
from ritrag.serving.skeleton import Column, IdColumn, IdListColumn

LOG = logging.getLogger("ritrag.serving")

RECORD_COLUMNS = ["url", "body"]  # read per node, on demand
# The shard files every load reads (and the vectors, where it re-ranks): hashed
# up front, in parallel (IndexReader.verify_files).
SERVED_KINDS = ("nodes", EDGES_KIND, SERVING_KIND, "dense")


class LoadedVersion:
    """One version of an index, ready for retrieval: its `reader`, its
    segments' mapped serving files and the arrays derived from them (module
    docstring). With a `cache_dir`, a local index's files are stamped there
    once hashed.

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
            # first load and trusted by their stamps after, also by a restart
            # (at 10M chunks, hashing was 23 of a restart's 29 s).
            self.reader = IndexReader(StampedLayout(root, local_stamps(cache_dir, root)) if cache_dir else root,
                                      version)
        self.manifest = self.reader.manifest
        self.version = self.reader.version
        self.cache_dir = cache_dir
        LOG.info("loading %s of %s (%d segments)", self.version, root, len(self.manifest.segments))
        # IVF-PQ candidates are re-ranked exactly against the stored float16
        # vectors (memory-mapped) when the build asked for it (dense.json "rerank").
        self.dense_rerank = self.manifest.settings.dense.rerank
        self.reader.verify_files((*SERVED_KINDS, *([VECTORS_KIND] if self.dense_rerank > 1 else [])),
                                 os.cpu_count() or 1)
        stats = [json.load(open(f, encoding="utf-8")) for f in self.reader.segment_files(BM25_STATS_FILE)]
        n_chunks, n_terms = sum(s["n_chunks"] for s in stats), sum(s["n_terms"] for s in stats)
        bm25 = self.manifest.settings.bm25

        positions = self.reader.positions("nodes")
        # held: the node columns (shared with the next version this process loads)
        self.node_columns, self.node_row, self.skeleton = derive_nodes(self.reader)
        columns = self.node_columns.columns
        self.nodes: dict[str, Sequence] = {name: Column(columns[name])
                                           for name in ("node_id", "title", "summary", "keywords")}
        self.nodes["parent_id"], self.nodes["ancestor_ids"] = (IdColumn(columns["parent_key"]),
                                                              IdListColumn(columns["ancestor_keys"]))
        self.nodes["position"] = self.skeleton.position
        segments = version_shards(self.reader)
        first_file = {}
        for i, f in enumerate(positions.files):
            first_file.setdefault(f.segment, int(positions.file_start[i]))
        self.chunks = VersionChunks(self.reader, segments, [first_file[seg.segment] for seg in segments],
                                    self.node_row, positions.num_rows, self.node_columns.node_files)
        self.chunk_ids, self.chunk_node = self.chunks.chunk_ids, self.chunks.chunk_node
        self.chunk_kind = self.chunks.chunk_kind  # body chunk, node document or anchor document (ritrag.bm25)
        self.node_chunks = node_chunks(self.chunks, positions.num_rows)  # each node's body chunks
        self.postings = SegmentedPostings(self.chunks)
        self.bm25 = Bm25(self.postings, version_fields(segments, self.chunks, n_chunks, n_terms), bm25.k1, bm25.b)
        self.links = LinkGraph.of(self.reader, segments, self.skeleton)
        self._root_prior: RootPrior | None = None
        self._root_prior_lock = threading.Lock()

        # Whether node documents share the dense index with the chunks (an index
        # built with node_doc_vectors): a query then searches twice as deep.
        self.dense_node_docs = self.manifest.settings.index.representation.dense_node_docs
        self.dense_shards, self.dense_params, self._dense_segments = load_dense_shards(self.reader)
        self.vector_store = (VectorStore.open([f.path for f in self.reader.files("vectors")], populate=True)
                             if self.dense_rerank > 1 else None)
        # The load's Arrow temporaries (node files decoded, columns concatenated)
        # are freed by now but kept by Arrow's allocator for reuse: handed back,
        # a replica holds what it serves (at 1M nodes, 204 of 755 MiB anonymous).
        pa.default_memory_pool().release_unused()
        LOG.info("loaded %s: %d nodes, %d chunks (%d live) in %d segments, %d links, %d dense shards",
                 self.version, len(self.node_row), len(self.chunk_ids), int(self.chunks.live.sum()),
                 len(segments), len(self.links), len(self.dense_shards))

    def chunk_rows(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Live rows in the chunk arrays of chunk ids; -1 for unknown or dead ones."""
        return self.chunks.rows_of(chunk_ids)

    def root_prior(self) -> RootPrior:
        """The roots' prior (serving.root_prior), made at the first query that asks for it."""
        with self._root_prior_lock:
            if self._root_prior is None:
                bm25 = self.manifest.settings.bm25
                self._root_prior = RootPrior.of(self.reader, self.skeleton, self.nodes["node_id"],
                                                self.node_row.arrays()[1], bm25.k1, bm25.b)
            return self._root_prior

    def node_records(self, rows: Sequence[int]) -> dict[int, dict[str, Any]]:
        """{"url", "body"} of the given node rows, each read from the one row
        group that holds it (a group is read once however many rows it holds)."""
        return self.reader.positions("nodes").read(rows, RECORD_COLUMNS)
