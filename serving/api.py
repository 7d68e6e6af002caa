"""The two tools agents get, as a Python API: GetToC(query) and Read(node ids).

`get_toc` runs hybrid retrieval against the whole index (every call starts
afresh) and returns the query-induced sub-forest with no body text; `read`
returns node bodies, capped per node with a continuation offset. The CLI, HTTP
and MCP faces all call these two methods.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ritrag.analyzer import analyze
from ritrag.embedder import EmbedderSpec, encode, load_sentence_transformer
from serving.index import LoadedIndex
from serving.retrieval import (bm25_top_k, build_subforest, dense_top_k, node_scores,
                               reciprocal_rank_fusion, top_nodes)

DEFAULT_K = 200  # chunks recalled by each retriever (k')
DEFAULT_N = 50  # nodes kept
DEFAULT_MAX_CHARS = 20_000  # per node and Read call
TOC_FIELDS = ("title", "summary", "keywords")


class RitragIndex:
    """A loaded index version answering get_toc and read."""

    def __init__(self, index_dir: str, version: str | None = None, device: str | None = None):
        self.index = LoadedIndex(index_dir, version)
        self._spec = EmbedderSpec.from_dict(self.index.manifest.config["embedder"])
        self._device = device
        self._model = None

    @property
    def version(self) -> str:
        return self.index.version

    def embed_query(self, query: str) -> np.ndarray:
        if self._model is None:
            self._model = load_sentence_transformer(self._spec, self._device)
        return encode(self._model, [query], self._spec.query_prefix, self._spec.normalize)[0]

    def recall_chunks(self, query: str, k: int = DEFAULT_K) -> dict[int, float]:
        """Chunk row -> fused score for the top-k' chunks of BM25 and of dense."""
        idx = self.index
        bm25 = self.index.manifest.config.get("bm25", {})
        sparse_rows, _ = bm25_top_k(analyze(query), idx.postings, k, bm25.get("k1", 1.2), bm25.get("b", 0.75))
        dense_ids, _ = dense_top_k(self.embed_query(query), idx.dense_shards, k)
        dense_rows = idx.chunk_rows(dense_ids)
        return reciprocal_rank_fusion([sparse_rows, dense_rows[dense_rows >= 0]])

    def get_toc(self, query: str, k: int = DEFAULT_K, n: int = DEFAULT_N) -> dict:
        """GetToC: the query-induced sub-forest, as JSON-ready dicts, no body text."""
        idx = self.index
        hits = top_nodes(node_scores(self.recall_chunks(query, k), idx.chunk_node), n)
        trees = build_subforest(hits, idx.nodes, idx.node_row, TOC_FIELDS)
        return {"query": query, "version": self.version, "hits": len(hits), "trees": trees}

    def read(self, node_ids: Sequence[str], max_chars: int = DEFAULT_MAX_CHARS, offset: int = 0) -> dict:
        """Read: title, ancestor path, url and body of each node; unknown ids are
        reported, not fatal. Bodies longer than `max_chars` from `offset` are cut
        and carry `next_offset` to continue."""
        idx = self.index
        rows = {nid: idx.node_row.get(nid) for nid in node_ids}
        bodies = idx.node_bodies([r for r in rows.values() if r is not None])
        nodes, unknown = [], []
        for nid, row in rows.items():
            if row is None:
                unknown.append(nid)
                continue
            body = bodies.get(row, "")
            text = body[offset: offset + max_chars]
            entry = {
                "id": nid,
                "title": idx.nodes["title"][row],
                "path": [idx.nodes["title"][idx.node_row[a]] for a in idx.nodes["ancestor_ids"][row]
                         if a in idx.node_row],
                "url": idx.nodes["url"][row],
                "text": text,
                "total_chars": len(body),
            }
            if offset + max_chars < len(body):
                entry["next_offset"] = offset + max_chars
            nodes.append(entry)
        return {"version": self.version, "nodes": nodes, "unknown_ids": unknown}
