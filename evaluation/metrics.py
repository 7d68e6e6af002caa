"""The metrics of `ritrag eval` (ritrag.evaluation.eval): pure functions over
rankings of node rows, a question's targets (each a set of node rows) and
the text read.

Rank = position of the first item of any target (1 = best; hit@k, MRR);
nDCG@10 with binary gains, each target credited once, at its first item,
against an ideal ranking of min(targets, 10) items. Evidence recall = the
share of the question's evidence strings found verbatim (whitespace
normalized) in the text read. Evidence precision/recall/F1 of nodes read
(agent): a read node is correct when it belongs to a target; recall is over
targets.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

NDCG_K = 10


def gains(ranked: Sequence[int], targets: Sequence[frozenset[int]]) -> list[int]:
    """Binary gain of each ranked item: 1 when it belongs to a target not
    credited yet (each target is credited once, at its first item)."""
    open_targets = list(range(len(targets)))
    out = []
    for item in ranked:
        hit = next((t for t in open_targets if item in targets[t]), None)
        if hit is not None:
            open_targets.remove(hit)
        out.append(int(hit is not None))
    return out


def first_rank(item_gains: Sequence[int]) -> int | None:
    """1-based position of the first relevant item, None if there is none."""
    return next((i for i, g in enumerate(item_gains, start=1) if g), None)


def ndcg(item_gains: Sequence[int], n_targets: int, k: int = NDCG_K) -> float:
    """nDCG@k of binary gains against an ideal ranking of min(n_targets, k) relevant items."""
    dcg = sum(g / math.log2(i + 1) for i, g in enumerate(item_gains[:k], start=1))
    ideal = sum(1.0 / math.log2(i + 1) for i in range(1, min(n_targets, k) + 1))
    return dcg / ideal if ideal else 0.0


def normalize_space(text: str) -> str:
    return " ".join(text.split())


def evidence_found(evidence: Sequence[str], text: str) -> list[bool]:
    """Which evidence strings occur in `text`, whitespace normalized on both sides."""
    haystack = normalize_space(text)
    return [normalize_space(e) in haystack for e in evidence]


def node_prf(read: Sequence[int], targets: Sequence[frozenset[int]]) -> tuple[float, float, float]:
    """Evidence precision (read nodes inside a target), recall (targets with a
    node read) and F1 of the nodes read; nothing read scores 0, 0, 0."""
    read_set = set(read)
    if not read_set or not targets:
        return 0.0, 0.0, 0.0
    every = frozenset().union(*targets)
    precision = len(read_set & every) / len(read_set)
    recall = sum(bool(read_set & t) for t in targets) / len(targets)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None
