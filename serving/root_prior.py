"""A prior for the site or product a query names (issue #40, item 2).

Two "Configuring the server" pages of two products look alike to the chunk
rankings; the query often names which one it means ("... on Debian", "in
Django"). Each root of the forest gets a document: its title and the words of
its site key (the site's URL: host and path), which name the product even when
the root's title does not ("Welcome"). The query's BM25 over these few
documents, divided by the best root's, is each root's prior in [0, 1]; with
`root_weight` > 0 a candidate node's score gains `root_weight` x its root's
prior, so among look-alikes the one under the named root wins.

The dense side (`root_dense_weight`): the query vector against each root
document's vector (embedded by the index's own model), min-max normalized over
the roots, so the nearest root's nodes gain the most.

The documents are made at the first query that asks for the prior (default
weights 0: never), from the roots' titles in the skeleton and their site keys
read by id: one point read of the root rows, not of the node table.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from ritrag.analyzer import analyze
from ritrag.bm25 import idf
from ritrag.reader import IndexReader
from ritrag.serving.skeleton import Skeleton


class RootPrior:
    """BM25 over one document per root, and each node row's root."""

    def __init__(self, root_of: np.ndarray, root_texts: Sequence[str], k1: float, b: float):
        """`root_of[row]`: the index (into `root_texts`) of the row's root, -1
        for a row no live root holds; `root_texts`: each root's document."""
        self.root_of, self.root_texts = root_of, list(root_texts)
        root_docs = [analyze(text) for text in root_texts]
        self._k1 = k1
        lengths = np.array([len(doc) for doc in root_docs], np.float64)
        avg = float(lengths.mean()) if len(root_docs) else 0.0
        self._norm = k1 * (1.0 - b + b * lengths / max(avg, 1e-9))
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for i, doc in enumerate(root_docs):
            for term, tf in Counter(doc).items():
                postings.setdefault(term, ([], []))[0].append(i)
                postings[term][1].append(tf)
        self._postings = {term: (np.array(roots, np.int64), np.array(tfs, np.float64), idf(len(root_docs), len(roots)))
                          for term, (roots, tfs) in postings.items()}

    @classmethod
    def of(cls, reader: IndexReader, skeleton: Skeleton, node_ids: Sequence[str], live_rows: np.ndarray,
           k1: float, b: float) -> "RootPrior":
        """The prior of a loaded version: its live roots (rows without a live
        parent), their titles and site keys."""
        live = np.zeros(len(skeleton.parent_row), bool)
        live[live_rows] = True
        roots = np.flatnonzero(live & (skeleton.parent_row < 0))
        index_of = np.full(len(skeleton.parent_row), -1, np.int64)
        index_of[roots] = np.arange(len(roots))
        has_ancestor = skeleton.ancestor_indptr[1:] > skeleton.ancestor_indptr[:-1]
        first = skeleton.ancestor_rows[np.minimum(skeleton.ancestor_indptr[:-1], len(skeleton.ancestor_rows) - 1)] \
            if len(skeleton.ancestor_rows) else np.zeros(len(has_ancestor), np.int32)
        root_row = np.where(has_ancestor, first, np.arange(len(has_ancestor)))
        root_of = np.where(live, index_of[root_row], -1)
        ids = [node_ids[int(r)] for r in roots]
        sites = reader.rows_by_id("nodes", ids, ["site"])
        titles = skeleton.columns["title"]
        texts = [f"{titles[int(r)].as_py() or ''} {sites.get(i, {}).get('site') or ''}".strip()
                 for r, i in zip(roots, ids)]
        return cls(root_of, texts, k1, b)

    def root_scores(self, terms: Sequence[str]) -> np.ndarray:
        """Each root's prior for the query terms: BM25 over the root
        documents, divided by the best root's (all 0 when none matches)."""
        scores = np.zeros(len(self._norm), np.float64)
        for term, qtf in Counter(terms).items():
            if term in self._postings:
                roots, tf, weight = self._postings[term]
                scores[roots] += qtf * weight * tf * (self._k1 + 1.0) / (tf + self._norm[roots])
        best = scores.max() if len(scores) else 0.0
        return scores / best if best > 0 else scores

    @staticmethod
    def dense_scores(query_vector: np.ndarray, root_vectors: np.ndarray) -> np.ndarray:
        """Each root's dense prior: the query's similarity to the root
        document, min-max normalized over the roots (all 0 when they tie)."""
        sims = root_vectors @ np.asarray(query_vector, np.float32)
        if not len(sims) or sims.max() == sims.min():
            return np.zeros(len(sims))
        return (sims - sims.min()) / (sims.max() - sims.min())

    def boost(self, node_scores: Mapping[int, float], prior: np.ndarray, weight: float) -> dict[int, float]:
        """Node row -> its score + `weight` x its root's `prior` (one value per root)."""
        if not prior.any():
            return dict(node_scores)
        rows = np.fromiter(node_scores.keys(), np.int64, len(node_scores))
        roots = self.root_of[rows]
        added = np.where(roots >= 0, prior[np.maximum(roots, 0)], 0.0) * weight
        return {int(row): score + float(extra) for (row, score), extra in zip(node_scores.items(), added)}
