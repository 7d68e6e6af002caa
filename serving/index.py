"""Loading one published version of an index for serving.

Every file is checked against the manifest's sha256 before it is used; a damaged
file is refused with an error that names it. The node skeleton, the chunk ->
node map, the postings and the dense shards are held in memory; node bodies are
read from the node table on demand.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ritrag.layout import IndexLayout, Manifest

LOG = logging.getLogger("ritrag.serving")

SKELETON_COLUMNS = ["node_id", "parent_id", "site", "kind", "position", "depth", "title", "url",
                    "summary", "keywords", "ancestor_ids"]


@dataclass
class Postings:
    """All postings of the index as CSR over terms: rows of `term_ids`' entries."""

    term_row: dict[str, int]
    indptr: np.ndarray  # int64, len(terms) + 1
    chunk_index: np.ndarray  # int32 row in the chunk arrays
    tf: np.ndarray  # float32
    chunk_length: np.ndarray  # float32, terms per chunk
    df: dict[str, int]
    n_chunks: int
    avg_length: float


class LoadedIndex:
    """One version of an index, ready for retrieval."""

    def __init__(self, root: str, version: str | None = None):
        self.layout = IndexLayout(root)
        self.manifest: Manifest = self.layout.load_manifest(version)
        self.version = self.manifest.version
        self._load_nodes()
        self._load_chunks()
        self.postings = self._load_postings()
        self.dense_shards = self._load_dense()
        LOG.info("loaded %s: %d nodes, %d chunks, %d terms, %d dense shards",
                 self.version, len(self.node_ids), len(self.chunk_ids), len(self.postings.term_row),
                 len(self.dense_shards))

    def _files(self, kind: str) -> list[str]:
        return [self.layout.verified_path(seg, name)
                for seg in self.manifest.segments for name in self.layout.segment_files(seg, kind)]

    def _file(self, name: str) -> list[str]:
        return [self.layout.verified_path(seg, name) for seg in self.manifest.segments if name in seg["files"]]

    def _load_nodes(self) -> None:
        self._node_files = self._files("nodes")
        table = pa.concat_tables([pq.read_table(f, columns=SKELETON_COLUMNS) for f in self._node_files])
        self.nodes = table.to_pydict()
        self.node_ids: list[str] = self.nodes["node_id"]
        self.node_row = {nid: i for i, nid in enumerate(self.node_ids)}
        self.node_file_of = np.concatenate([
            np.full(pq.ParquetFile(f).metadata.num_rows, i, dtype=np.int32)
            for i, f in enumerate(self._node_files)
        ]) if self._node_files else np.zeros(0, np.int32)

    def _load_chunks(self) -> None:
        table = pa.concat_tables([pq.read_table(f, columns=["chunk_id", "node_id"])
                                  for f in self._files("chunks")])
        self.chunk_ids = table["chunk_id"].to_numpy()
        order = np.argsort(self.chunk_ids, kind="stable")
        self.chunk_ids = self.chunk_ids[order]
        node_ids = np.asarray(table["node_id"].to_pylist(), dtype=object)[order]
        self.chunk_node = np.fromiter((self.node_row[n] for n in node_ids), dtype=np.int32,
                                      count=len(node_ids))

    def chunk_rows(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Rows in the chunk arrays of known chunk ids; -1 for unknown ones."""
        pos = np.searchsorted(self.chunk_ids, chunk_ids)
        pos = np.clip(pos, 0, max(len(self.chunk_ids) - 1, 0))
        found = (len(self.chunk_ids) > 0) & (self.chunk_ids[pos] == chunk_ids)
        return np.where(found, pos, -1)

    def _load_postings(self) -> Postings:
        table = pa.concat_tables([pq.read_table(f) for f in self._files("postings")])
        terms = table["term"].combine_chunks().dictionary_encode()
        vocabulary = terms.dictionary.to_pylist()
        term_codes = terms.indices.to_numpy(zero_copy_only=False)
        rows = self.chunk_rows(table["chunk_id"].to_numpy())
        tf = table["tf"].to_numpy().astype(np.float32)
        order = np.argsort(term_codes, kind="stable")
        term_codes, rows, tf = term_codes[order], rows[order], tf[order]
        indptr = np.zeros(len(vocabulary) + 1, dtype=np.int64)
        np.cumsum(np.bincount(term_codes, minlength=len(vocabulary)), out=indptr[1:])
        chunk_length = np.bincount(rows, weights=tf, minlength=len(self.chunk_ids)).astype(np.float32)

        df: dict[str, int] = {}
        for f in self._file("vocabulary.parquet"):
            vocab = pq.read_table(f)
            for term, n in zip(vocab["term"].to_pylist(), vocab["df"].to_pylist()):
                df[term] = df.get(term, 0) + n
        stats = [json.load(open(f, encoding="utf-8")) for f in self._file("bm25.json")]
        n_chunks = sum(s["n_chunks"] for s in stats)
        n_terms = sum(s["n_terms"] for s in stats)
        return Postings(
            term_row={t: i for i, t in enumerate(vocabulary)},
            indptr=indptr, chunk_index=rows.astype(np.int32), tf=tf, chunk_length=chunk_length,
            df=df, n_chunks=n_chunks, avg_length=(n_terms / n_chunks) if n_chunks else 0.0,
        )

    def _load_dense(self) -> list:
        shards = []
        for path in self._files("dense"):
            try:
                shards.append(faiss.read_index(path))
            except RuntimeError as exc:
                raise RuntimeError(f"{path}: not a readable FAISS index ({exc})") from exc
        nprobe = int(self.manifest.config.get("dense", {}).get("nprobe", 64))
        for shard in shards:
            if hasattr(shard, "nprobe"):
                shard.nprobe = nprobe
            else:
                try:
                    faiss.extract_index_ivf(shard).nprobe = nprobe
                except RuntimeError:
                    pass  # not an IVF index: exact search has no nprobe
        return shards

    def node_bodies(self, rows: list[int]) -> dict[int, str]:
        """Bodies of the given node rows, read from their node files."""
        out: dict[int, str] = {}
        by_file: dict[int, list[int]] = {}
        for row in rows:
            by_file.setdefault(int(self.node_file_of[row]), []).append(row)
        for file_index, file_rows in by_file.items():
            wanted = pa.array([self.node_ids[r] for r in file_rows])
            table = pq.read_table(self._node_files[file_index], columns=["node_id", "body"],
                                  filters=pc.field("node_id").isin(wanted))
            found = dict(zip(table["node_id"].to_pylist(), table["body"].to_pylist()))
            for r in file_rows:
                out[r] = found.get(self.node_ids[r], "")
        return out
