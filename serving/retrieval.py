"""Hybrid retrieval and the query-induced sub-forest (METHOD.md, steps 1-5).

Pure numpy functions over a `LoadedIndex`'s arrays, so each step is testable on
its own: BM25 top-k', dense top-k', reciprocal rank fusion, node score = max of
its chunks' fused scores, top-n nodes, union with all ancestors, trees ordered
by their best node score and children in document order.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from serving.index import Postings

RRF_K = 60


def bm25_top_k(terms: Sequence[str], postings: Postings, k: int, k1: float = 1.2, b: float = 0.75
               ) -> tuple[np.ndarray, np.ndarray]:
    """(chunk rows, scores) of the k best chunks for the analyzed query `terms`,
    best first; ties broken by chunk row for determinism."""
    scores = np.zeros(len(postings.chunk_length), dtype=np.float32)
    n = postings.n_chunks
    norm = k1 * (1.0 - b + b * postings.chunk_length / max(postings.avg_length, 1e-9))
    for term, qtf in Counter(terms).items():
        row = postings.term_row.get(term)
        if row is None:
            continue
        df = postings.df.get(term, 0)
        idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        lo, hi = postings.indptr[row], postings.indptr[row + 1]
        docs, tf = postings.chunk_index[lo:hi], postings.tf[lo:hi]
        valid = docs >= 0
        docs, tf = docs[valid], tf[valid]
        scores[docs] += qtf * idf * tf * (k1 + 1.0) / (tf + norm[docs])
    return top_k(scores, k)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the k largest positive scores, best first."""
    positive = np.flatnonzero(scores > 0)
    if len(positive) > k:
        part = np.argpartition(-scores[positive], k - 1)[:k]
        positive = positive[part]
    order = np.lexsort((positive, -scores[positive]))
    chosen = positive[order]
    return chosen, scores[chosen]


def dense_top_k(query: np.ndarray, shards: list, k: int, dead: Sequence[np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(chunk ids, similarities) of the k nearest chunks over every dense shard.
    `dead[i]`, sorted chunk ids that later segments tombstoned, are skipped in
    shard i (it is searched that much deeper so that k live ones remain)."""
    ids, sims = [], []
    q = np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32)
    for n, shard in enumerate(shards):
        if shard.ntotal == 0:
            continue
        shard_dead = dead[n] if dead is not None else np.zeros(0, np.int64)
        d, i = shard.search(q, min(k + len(shard_dead), shard.ntotal))
        keep = i[0] >= 0
        if len(shard_dead):
            keep &= ~np.isin(i[0], shard_dead)
        ids.append(i[0][keep][:k])
        sims.append(d[0][keep][:k])
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    all_ids, all_sims = np.concatenate(ids), np.concatenate(sims)
    order = np.lexsort((all_ids, -all_sims))[:k]
    return all_ids[order], all_sims[order]


def reciprocal_rank_fusion(rankings: Sequence[np.ndarray], k: int = RRF_K) -> dict[int, float]:
    """Fused score of every item: the sum over rankings of 1 / (k + rank), rank from 1."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking.tolist(), start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return fused


def node_scores(chunk_scores: dict[int, float], chunk_node: np.ndarray) -> dict[int, float]:
    """Node row -> the maximum fused score of its recalled chunks."""
    best: dict[int, float] = {}
    for row, score in chunk_scores.items():
        node = int(chunk_node[row])
        if score > best.get(node, 0.0):
            best[node] = score
    return best


def top_nodes(scores: dict[int, float], n: int) -> list[tuple[int, float]]:
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def build_subforest(hits: list[tuple[int, float]], nodes: dict, node_row: dict[str, int],
                    fields: Sequence[str] = ("title",)) -> list[dict]:
    """The query-induced sub-forest: hit nodes plus all their ancestors.

    Returns the trees (one per root), ordered by the best hit score inside each;
    children in their original document order. Every entry carries `id`, the
    requested metadata `fields`, `hit` (True for retrieved nodes, False for
    ancestors shown only as context) and, on hits, `score`.
    """
    score_of = dict(hits)
    included: set[int] = set()
    for row, _ in hits:
        included.add(row)
        for ancestor in nodes["ancestor_ids"][row]:
            a = node_row.get(ancestor)
            if a is not None:
                included.add(a)

    children: dict[int, list[int]] = {}
    roots = []
    for row in included:
        parent = node_row.get(nodes["parent_id"][row]) if nodes["parent_id"][row] else None
        if parent is None or parent not in included:
            roots.append(row)
        else:
            children.setdefault(parent, []).append(row)

    def render(row: int) -> tuple[dict, float]:
        entry = {"id": nodes["node_id"][row]}
        for field in fields:
            value = nodes[field][row]
            if value:
                entry[field] = value
        best = score_of.get(row, 0.0)
        entry["hit"] = row in score_of
        if entry["hit"]:
            entry["score"] = round(score_of[row], 6)
        kids = sorted(children.get(row, []), key=lambda r: (nodes["position"][r], nodes["node_id"][r]))
        if kids:
            rendered = [render(k) for k in kids]
            entry["children"] = [e for e, _ in rendered]
            best = max([best] + [s for _, s in rendered])
        return entry, best

    trees = [render(r) for r in roots]
    trees.sort(key=lambda t: (-t[1], t[0]["id"]))
    return [t for t, _ in trees]
