"""Hybrid retrieval and the query-induced sub-forest (docs/METHOD.md, steps 1-5).

Pure numpy functions over a `LoadedVersion`'s arrays, so each step is testable on
its own: BM25 top-k', dense top-k', fusion of the two, node score = max of its
chunks' fused scores, top-n nodes, union with all ancestors, trees ordered by
their best node score and children in document order.

Fusion (`fusion`): "minmax", the default, is a convex combination of the two
retrievers' scores, each min-max normalized over its own top-k' (Bruch et al.,
"An Analysis of Fusion Functions for Hybrid Retrieval", TOIS 2023): unlike
reciprocal rank fusion ("rrf", docs/METHOD.md's rule, kept as an option) it keeps
how far apart the scores are, so a chunk far ahead in one ranking is not pulled
level with a chunk that is merely second in both (benchmarks/RESULTS.md,
"Before and after on the full dev corpus").

BM25 (one field, or chunk bodies + `path_weight` x their node's document +
`anchor_weight` x their node's in-link anchors in indexes with node
documents) is ritrag/bm25.py's. Node documents are also
ranked on their own (BM25 and dense), and with `node_score` "max+doc" a node
scores its best chunk's fused score + `node_doc_weight` x its document's fused
score; "max" is the paper's rule. With `root_weight` (BM25) or `root_dense_weight`
(vectors) > 0 a node also gains that much of the query's prior for its root
(serving/root_prior.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np

from ritrag.flags import option
from ritrag.representation import DEFAULT_RETRIEVAL
from ritrag.serving.skeleton import Skeleton

RRF_K = DEFAULT_RETRIEVAL["rrf_k"]
NODE_SCORES = ("max", "max+doc")
FUSIONS = ("minmax", "rrf")
Ranking = tuple[np.ndarray, np.ndarray]  # (rows, scores), best first


def _param(name: str, help: str) -> Any:
    """A retrieval parameter: its default DEFAULT_RETRIEVAL's; its flag's default
    None, so that an evaluation left without it uses the index's recorded value."""
    return option(DEFAULT_RETRIEVAL[name], f"{help} (default: the index's recorded value)", default_in_help=True)


@dataclass(frozen=True)
class RetrievalParams:
    """Query-time parameters of hybrid retrieval (the build records its defaults
    in the manifest, config "retrieval"; benchmarks/RESULTS.md has the sweep)."""

    # Each field is a flag of `ritrag eval`, left out: the index's recorded value.
    fusion: str = _param("fusion", "how BM25 and dense are fused: minmax (normalized scores, the default) or rrf "
                                   "(ranks)")
    rrf_k: float = _param("rrf_k", "reciprocal rank fusion constant (fusion rrf)")
    sparse_weight: float = _param("sparse_weight", "weight of the BM25 ranking in the fusion")
    dense_weight: float = _param("dense_weight", "weight of the dense ranking in the fusion")
    path_weight: float = _param("path_weight", "BM25 weight of the node path field in a chunk's score")
    anchor_weight: float = _param("anchor_weight", "BM25 weight of the node's in-link anchor texts field in a "
                                                   "chunk's score")
    node_score: str = _param("node_score", "node score: max (the paper's rule: best chunk) or max+doc (+ the "
                                           "node's own match)")
    node_doc_weight: float = _param("node_doc_weight", "weight of the node's own match under max+doc")
    root_weight: float = _param("root_weight", "weight of the query's prior for a node's root: BM25 over the "
                                               "roots' titles and site keys")
    root_dense_weight: float = _param("root_dense_weight", "weight of the query vector's prior for a node's root: "
                                                           "its similarity to the root's title and site key, "
                                                           "min-max over the roots")

    def __post_init__(self):
        if self.node_score not in NODE_SCORES:
            raise ValueError(f"node_score must be one of {NODE_SCORES}, not {self.node_score!r}")
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}, not {self.fusion!r}")
        if self.rrf_k <= 0 or min(self.sparse_weight, self.dense_weight, self.path_weight, self.anchor_weight,
                                  self.node_doc_weight, self.root_weight,
                                  self.root_dense_weight) < 0:
            raise ValueError("rrf_k must be positive and weights non-negative")
        if self.sparse_weight + self.dense_weight == 0:
            raise ValueError("sparse_weight and dense_weight must not both be 0")

    @classmethod
    def recorded(cls, recorded: Mapping[str, Any], **overrides: Any) -> "RetrievalParams":
        """The parameters a manifest records (`ManifestConfig.retrieval`, with its
        defaults for older manifests), with `overrides` (None values ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in recorded.items() if k in known},
                      **{k: v for k, v in overrides.items() if v is not None}})


def dense_top_k(query: np.ndarray, shards: list, k: int, params: Sequence | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(chunk ids, similarities) of the k nearest chunks over every dense shard,
    shard i searched with `params[i]` (its tombstone selector,
    serving.dense_shards.tombstone_parameters; None: every chunk is live)."""
    ids, sims = [], []
    q = np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32)
    for n, shard in enumerate(shards):
        if shard.ntotal == 0:
            continue
        shard_params = params[n] if params is not None else None
        d, i = shard.search(q, min(k, shard.ntotal), params=shard_params)
        keep = i[0] >= 0
        ids.append(i[0][keep])
        sims.append(d[0][keep])
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    all_ids, all_sims = np.concatenate(ids), np.concatenate(sims)
    order = np.lexsort((all_ids, -all_sims))[:k]
    return all_ids[order], all_sims[order]


def reciprocal_rank_fusion(rankings: Sequence[np.ndarray], k: float = RRF_K,
                           weights: Sequence[float] | None = None) -> dict[int, float]:
    """Fused score of every item: the sum over rankings of weight / (k + rank),
    rank from 1 (weights default to 1)."""
    fused: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings)):
        if weight == 0:
            continue
        for rank, item in enumerate(np.asarray(ranking).tolist(), start=1):
            fused[item] = fused.get(item, 0.0) + weight / (k + rank)
    return fused


def minmax_fusion(rankings: Sequence[Ranking], weights: Sequence[float] | None = None) -> dict[int, float]:
    """Fused score of every item: the weighted mean over rankings of its score
    min-max normalized within that ranking (its best item 1, its last 0; an item
    a ranking did not return scores 0 there; a ranking of equal scores gives
    each of its items 1). Weights default to 1."""
    weights = list(weights or [1.0] * len(rankings))
    total = sum(weights)
    fused: dict[int, float] = {}
    for (rows, scores), weight in zip(rankings, weights):
        if weight == 0 or len(rows) == 0:
            continue
        scores = np.asarray(scores, np.float64)
        low, spread = scores.min(), scores.max() - scores.min()
        normalized = (scores - low) / spread if spread > 0 else np.ones_like(scores)
        for item, value in zip(np.asarray(rows).tolist(), (weight / total * normalized).tolist()):
            fused[item] = fused.get(item, 0.0) + value
    return fused


def fuse(rankings: Sequence[Ranking], params: RetrievalParams) -> dict[int, float]:
    """Item -> fused score of the (BM25, dense) rankings under `params.fusion`."""
    weights = (params.sparse_weight, params.dense_weight)
    if params.fusion == "rrf":
        return reciprocal_rank_fusion([rows for rows, _ in rankings], params.rrf_k, weights)
    return minmax_fusion(rankings, weights)


def node_scores(chunk_scores: dict[int, float], chunk_node: np.ndarray) -> dict[int, float]:
    """Node row -> the maximum fused score of its recalled chunks."""
    rows = np.fromiter(chunk_scores, np.int64, len(chunk_scores))
    best: dict[int, float] = {}
    # The nodes gathered in one fancy index: an element read of a mapped array
    # costs a Python call each (about 2 us, 400 of them per query).
    for node, score in zip(chunk_node[rows].tolist(), chunk_scores.values()):
        if score > best.get(node, 0.0):
            best[node] = score
    return best


def with_node_docs(chunk_best: dict[int, float], doc_scores: dict[int, float], weight: float
                   ) -> dict[int, float]:
    """Node row -> its best chunk's score + `weight` x its own document's score
    (either may be missing: 0)."""
    out = dict(chunk_best)
    for node, score in doc_scores.items():
        out[node] = out.get(node, 0.0) + weight * score
    return out


def top_nodes(scores: dict[int, float], n: int) -> list[tuple[int, float]]:
    """The `n` best (row, score) pairs, best first, ties by row."""
    # One array sort: a Python sort keyed per item costs more at a query's few hundred nodes.
    rows = np.fromiter(scores, np.int64, len(scores))
    values = np.fromiter(scores.values(), np.float64, len(scores))
    best = np.lexsort((rows, -values))[:n]
    return list(zip(rows[best].tolist(), values[best].tolist()))


def shown_rows(hit_rows: np.ndarray, skeleton: Skeleton) -> np.ndarray:
    """The rows a ToC of `hit_rows` shows: the hits and all their ancestors, sorted."""
    return np.union1d(hit_rows, skeleton.ancestors(hit_rows))


def build_subforest(hits: list[tuple[int, float]], skeleton: Skeleton, fields: Sequence[str] = ("title",),
                    shown: np.ndarray | None = None) -> list[dict]:
    """The query-induced sub-forest: hit nodes plus all their ancestors.

    Returns the trees (one per root: a node whose parent is not included),
    ordered by the best hit score inside each, then root id; children in
    their original document order (position, then id). Every entry carries
    `id`, the requested metadata `fields` when not empty, `hit` (True for
    retrieved nodes, False for ancestors shown only as context) and, on hits,
    `score`. Rows and columns are gathered in a few array operations; Python
    runs once per entry, to make its dict. `shown`: the hits' `shown_rows`,
    when the caller has them (the ancestors are a search per id).
    """
    if not hits:
        return []
    hit_rows = np.array([row for row, _ in hits], np.int64)
    rows = shown_rows(hit_rows, skeleton) if shown is None else shown
    score = np.zeros(len(rows))
    is_hit = np.zeros(len(rows), bool)
    at = np.searchsorted(rows, hit_rows)
    score[at], is_hit[at] = [s for _, s in hits], True
    parent = skeleton.parents(rows)
    up = np.minimum(np.searchsorted(rows, parent), len(rows) - 1)  # each row's parent's place in `rows`
    has_parent = (parent >= 0) & (rows[up] == parent)
    ids = skeleton.columns["node_id"].take(rows).to_pylist()
    # A subtree's best score: pushed up one level per pass, as deep as the deepest chain.
    best = score.copy()
    child, parent_at = np.flatnonzero(has_parent), up[has_parent]
    while len(child):
        lifted = best.copy()
        np.maximum.at(lifted, parent_at, best[child])
        if np.array_equal(lifted, best):
            break
        best = lifted

    # Python walks plain lists: a numpy scalar read per entry costs more than the entry.
    values = [(field, skeleton.columns[field].take(rows).to_pylist()) for field in fields]
    entries = []
    for i, (node_id, hit, node_score) in enumerate(zip(ids, is_hit.tolist(), score.tolist())):
        entry = {"id": node_id}
        for field, column in values:
            if column[i]:
                entry[field] = column[i]
        entry["hit"] = hit
        if hit:
            entry["score"] = round(node_score, 6)
        entries.append(entry)
    # Children in document order: sorted by (parent, position, id), appended in that order.
    names = np.array(ids)
    order = np.lexsort((names[child], skeleton.position[rows[child]], parent_at))
    for parent, kid in zip(parent_at[order].tolist(), child[order].tolist()):
        entries[parent].setdefault("children", []).append(entries[kid])
    roots = np.flatnonzero(~has_parent)
    return [entries[i] for i in roots[np.lexsort((names[roots], -best[roots]))]]
