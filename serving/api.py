"""The two tools agents get, as a Python API: GetToC(query) and Read(node ids).

`get_toc` runs hybrid retrieval against the whole index (every call starts
afresh) and returns the query-induced sub-forest with no body text; `read`
returns node bodies, capped per node with a continuation offset. The CLI calls
these two methods directly; the HTTP and MCP faces call them through
`ritrag.serving.tools.ToolService`, which adds limits, episode budgets and rendering.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ritrag.analyzer import analyze
from ritrag.bm25 import DOC, top_k
from ritrag.vectors import rerank_exact
from ritrag.embedder import ModelFilesError, check_backend_available, check_model_files
from ritrag.encoders import QueryEmbedder
from ritrag.layout import DamagedIndexError, MissingIndexError
from ritrag.serving.errors import ToolError, checked_int, checked_text
from ritrag.serving.index import LoadedVersion
from ritrag.serving.links import DEFAULT_CROSS_LINKS, see_also
from ritrag.serving.outline import preorder
from ritrag.serving.passages import focus
from ritrag.serving.root_prior import RootPrior
from ritrag.serving.retrieval import (Ranking, RetrievalParams, build_subforest, dense_top_k, fuse, node_scores,
                                     shown_rows, top_nodes, with_node_docs)

DEFAULT_K = 200  # chunks recalled by each retriever (k')
DEFAULT_N = 50  # nodes kept
DEFAULT_MAX_CHARS = 20_000  # per node and Read call
TOC_FIELDS = ("title", "summary", "keywords")


def check_toc_arguments(query: str, k: int, n: int) -> None:
    """GetToC's arguments, refused with `invalid_arguments` (a ToolError) when
    of the wrong type or out of range: every face reaches these checks."""
    checked_text("query", query)
    checked_int("k", k, 1)
    checked_int("n", n, 1)


def check_read_arguments(node_ids: Sequence[str], max_chars: int, offset: int) -> None:
    """Read's arguments, as `check_toc_arguments` checks GetToC's."""
    if isinstance(node_ids, (str, bytes)) or not isinstance(node_ids, Sequence):
        raise ToolError("invalid_arguments", "node_ids must be a list of strings",
                        errors=[{"field": "node_ids", "message": "not a list"}])
    for node_id in node_ids:
        checked_text("node_ids", node_id)
    checked_int("max_chars", max_chars, 1)
    checked_int("offset", offset, 0)


def one_thread_per_query() -> None:
    """Embed and search each query on one thread, process-wide: a server gets
    its parallelism from concurrent requests, and intra-query threads only
    add barrier waits (on 2 busy cores: query embedding p50 102 -> 12 ms,
    a flat FAISS search 13x faster; benchmarks/RESULTS.md). numpy's BLAS
    too, which runs the numpy query encoder (ritrag/numpy_bert.py)."""
    import faiss
    import torch
    from threadpoolctl import threadpool_limits

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")


@dataclass(frozen=True)
class Rankings:
    """(rows of the chunk arrays, scores), best first: (BM25, dense) top-k'
    chunks, and the same for node documents (None for an index without them,
    or parameters that do not fuse them)."""

    chunks: tuple[Ranking, Ranking]
    docs: tuple[Ranking, Ranking] | None


@dataclass(frozen=True)
class Retrieval:
    rankings: Rankings
    fused: dict[int, float]  # chunk row -> fused score
    hits: list[tuple[int, float]]  # (node row, node score), best first
    scores: dict[int, float]  # node row -> node score, of every node scored (the hits are its top n)


class RitragIndex:
    """A loaded index version answering get_toc and read; safe to share
    between threads. `loaded` is that version (serving.index.LoadedVersion):
    its reader, manifest, node and chunk arrays, BM25, links and dense shards."""

    def __init__(self, index_dir: str, version: str | None = None, device: str | None = None,
                 cache_dir: str | None = None):
        self.loaded = LoadedVersion(index_dir, version, cache_dir)
        try:
            self.params = RetrievalParams.recorded(self.loaded.manifest.settings.retrieval)
        except ValueError as exc:  # an unknown fusion, a zero rrf_k: the manifest's fault, not a bug
            raise DamagedIndexError(f"{index_dir}: the manifest's retrieval parameters: {exc}") from None
        self._spec = self.loaded.manifest.settings.index.embedder
        check_backend_available(self._spec)  # refused at load, not at the first query
        try:
            check_model_files(self._spec)  # an adapted model's folder: there, with the same weights
        except ModelFilesError as exc:  # a refusal of the index, as a missing or damaged file of it is
            raise (MissingIndexError if exc.missing else DamagedIndexError)(f"{index_dir}: {exc}") from None
        self._device = device
        self._embedder: QueryEmbedder | None = None
        self._embedder_lock = threading.Lock()
        self._root_vectors: np.ndarray | None = None

    @property
    def version(self) -> str:
        return self.loaded.version

    def summary(self) -> str:
        """One line for a log: the version and what it holds."""
        idx = self.loaded
        return (f"{idx.version} ({len(idx.node_row):,} nodes, {int(idx.chunks.live.sum()):,} chunks, "
                f"{len(idx.manifest.segments)} segments)")

    def adopt_embedder(self, other: "RitragIndex") -> None:
        """Reuse `other`'s loaded query model when both versions were embedded
        with the same spec (a hot swap then loads no second model)."""
        if other._spec == self._spec and other._embedder is not None:
            self._embedder = other._embedder

    def root_vectors(self) -> np.ndarray:
        """The roots' documents (serving.root_prior) embedded by the query
        model, at the first query that asks for them."""
        if self._root_vectors is None:
            texts = self.loaded.root_prior().root_texts
            vectors = self._query_embedder().embed(texts) if texts else np.zeros((0, 1), np.float32)
            self._root_vectors = np.asarray(vectors, np.float32)  # one assignment: readers see None or all
        return self._root_vectors

    def embed_query(self, query: str) -> np.ndarray:
        """The query's vector, embedded exactly as the index's documents were
        (the model loads on first use)."""
        return self._query_embedder().embed([query])[0]

    def _query_embedder(self) -> QueryEmbedder:
        if self._embedder is None:
            with self._embedder_lock:
                if self._embedder is None:
                    self._embedder = QueryEmbedder(self._spec, self._device)
        return self._embedder

    def rankings(self, query: str, k: int = DEFAULT_K, query_vector: np.ndarray | None = None,
                 params: RetrievalParams | None = None) -> Rankings:
        """BM25's and dense's top-k' chunks and, where the parameters fuse them
        (`node_score` "max+doc"), top-k' node documents, with their scores,
        best first: the rankings GetToC fuses (evaluation also scores each
        alone, as a baseline). Nothing the parameters do not use is scored."""
        idx, params = self.loaded, params or self.params
        vector = self.embed_query(query) if query_vector is None else query_vector
        node_docs = "doc" in idx.bm25.fields
        # With node documents in the dense index, twice k' neighbours are split into chunks and documents.
        depth = k * (2 if idx.dense_node_docs else 1)
        if idx.vector_store is None:
            dense_ids, similarities = dense_top_k(vector, idx.dense_shards, depth, idx.dense_params)
        else:
            candidates, _ = dense_top_k(vector, idx.dense_shards, idx.dense_rerank * depth, idx.dense_params)
            dense_ids, similarities = (a[:depth] for a in rerank_exact(vector, candidates, idx.vector_store))
        dense_rows = idx.chunk_rows(dense_ids)
        live = dense_rows >= 0
        dense_rows, similarities = dense_rows[live], similarities[live]
        if "all" in idx.bm25.fields:
            return Rankings((idx.bm25.top_k(analyze(query), "all", k, idx.chunk_ids), (dense_rows, similarities)),
                            None)
        terms = analyze(query)
        best, own = idx.bm25.chunk_top_k(terms, {"doc": params.path_weight, "anchors": params.anchor_weight},
                                         idx.chunk_node, idx.node_chunks, k, idx.chunk_ids)
        is_doc = idx.chunk_kind[dense_rows] == DOC  # anchor documents have no vectors
        chunks = (best, (dense_rows[~is_doc][:k], similarities[~is_doc][:k]))
        if not node_docs or params.node_score != "max+doc":
            return Rankings(chunks, None)
        doc_scores = own["doc"] if "doc" in own else idx.bm25.scores(terms, "doc")
        docs = (top_k(doc_scores, k, idx.chunk_ids), (dense_rows[is_doc][:k], similarities[is_doc][:k]))
        return Rankings(chunks, docs)

    def retrieve(self, query: str, k: int = DEFAULT_K, n: int = DEFAULT_N, query_vector: np.ndarray | None = None,
                 params: RetrievalParams | None = None) -> Retrieval:
        """docs/METHOD.md steps 1-3: the rankings, the fused chunk scores and the top-n
        (node row, score) hits, best first."""
        params = params or self.params
        # embedded once: the rankings and the dense root prior both use it
        vector = self.embed_query(query) if query_vector is None else query_vector
        rankings = self.rankings(query, k, vector, params)
        fused = fuse(rankings.chunks, params)
        scores = node_scores(fused, self.loaded.chunk_node)
        if params.node_score == "max+doc" and rankings.docs is not None:
            docs = fuse(rankings.docs, params)
            scores = with_node_docs(scores, node_scores(docs, self.loaded.chunk_node), params.node_doc_weight)
        if params.root_weight > 0:
            prior = self.loaded.root_prior()
            scores = prior.boost(scores, prior.root_scores(analyze(query)), params.root_weight)
        if params.root_dense_weight > 0:
            scores = self.loaded.root_prior().boost(scores, RootPrior.dense_scores(vector, self.root_vectors()),
                                                   params.root_dense_weight)
        return Retrieval(rankings, fused, top_nodes(scores, n), scores)

    def get_toc(self, query: str, k: int = DEFAULT_K, n: int = DEFAULT_N,
                query_vector: np.ndarray | None = None, params: RetrievalParams | None = None,
                cross_links: bool = DEFAULT_CROSS_LINKS) -> dict:
        """GetToC: the query-induced sub-forest, as JSON-ready dicts, no body
        text. `query_vector`: the query already embedded (by `embed_query`),
        for callers that batch or cache embeddings; `params`: other than the
        index's recorded retrieval parameters; `cross_links`: each hit lists
        its related nodes elsewhere in the forest (`see_also`)."""
        check_toc_arguments(query, k, n)
        return self.answer_toc(query, k, n, query_vector, params, cross_links)

    def answer_toc(self, query: str, k: int, n: int, query_vector: np.ndarray | None = None,
                   params: RetrievalParams | None = None, cross_links: bool = DEFAULT_CROSS_LINKS) -> dict:
        """`get_toc` for arguments its caller checked (`check_toc_arguments`):
        the tool faces check them before they charge an episode's budget."""
        retrieval = self.retrieve(query, k, n, query_vector, params)
        return self.toc_of(query, retrieval.hits, retrieval.scores if cross_links else None)

    def toc_of(self, query: str, hits: list[tuple[int, float]], scores: dict[int, float] | None = None) -> dict:
        """The GetToC result for ranked hits, (node row, score) best first.
        With `scores` (`Retrieval.scores`), each hit that links to or from
        nodes the ToC does not show carries `see_also`, up to
        ritrag.serving.links.MAX_SEE_ALSO of them as {id, title}, ranked by
        `scores` (ritrag.serving.links.see_also)."""
        idx = self.loaded
        hit_rows = np.array([row for row, _ in hits], np.int64)
        shown = shown_rows(hit_rows, idx.skeleton)
        trees = build_subforest(hits, idx.skeleton, TOC_FIELDS, shown)
        if scores is not None and hits:
            related = see_also(hit_rows.tolist(), shown, idx.links, idx.skeleton, scores)
            if related:
                entries = {entry["id"]: entry for entry, _ in preorder(trees)}
                titles = idx.skeleton.columns["title"]
                for row, rows in related.items():
                    entries[idx.nodes["node_id"][row]]["see_also"] = [
                        {"id": idx.nodes["node_id"][r], "title": titles[r].as_py()} for r in rows]
        return {"query": query, "version": self.version, "hits": len(hits), "trees": trees}

    def read(self, node_ids: Sequence[str], max_chars: int = DEFAULT_MAX_CHARS, offset: int = 0,
             query: str | None = None) -> dict:
        """Read: title, ancestor path, url and body of each node; unknown ids are
        reported, not fatal. Bodies longer than `max_chars` from `offset` are cut
        and carry `next_offset` to continue. With a `query` (and offset 0), each
        text is the node's passages most relevant to it, best first, within
        `max_chars` (serving/passages.py), with their offsets (`passages`) and
        the characters left out (`skipped_chars`); a Read without a query gives
        the text in order from any offset."""
        check_read_arguments(node_ids, max_chars, offset)
        if query is not None:
            checked_text("query", query)
        focused_on = query if query and query.strip() and offset == 0 else None
        idx = self.loaded
        rows = {nid: idx.node_row.get(nid) for nid in dict.fromkeys(node_ids)}
        records = idx.node_records([r for r in rows.values() if r is not None])
        nodes, unknown = [], []
        for nid, row in rows.items():
            if row is None:
                unknown.append(nid)
                continue
            body = records[row]["body"] or ""
            entry = {
                "id": nid,
                "title": idx.nodes["title"][row],
                "path": [idx.nodes["title"][a] for a in idx.skeleton.ancestors(np.array([row])).tolist()],
                "url": records[row]["url"],
                "text": body[offset: offset + max_chars],
                "total_chars": len(body),
            }
            if focused_on is not None and len(body) > max_chars:
                chosen = focus(body, focused_on, idx.bm25, max_chars)
                entry.update(text=chosen.text, skipped_chars=chosen.skipped_chars,
                             passages=[{"offset": at, "chars": len(text)} for at, text in chosen.passages])
            elif offset + max_chars < len(body):
                entry["next_offset"] = offset + max_chars
            nodes.append(entry)
        return {"version": self.version, "nodes": nodes, "unknown_ids": unknown}
