"""Cross-links in GetToC: for each retrieved node, a few related nodes that
its trees do not show, taken from the link graph (the edges table, issue #30).

The ToC shows a hit inside its ancestor chain; what the pages themselves link
to, or are linked from, sits elsewhere in the forest, often in another
chapter or version. `LinkGraph` holds every live edge between node rows as
two CSRs (derived once at load, ritrag.serving.derived_arrays); `see_also`
picks, per hit, up to `MAX_SEE_ALSO` of its out- and in-link neighbours that
are neither in its own chain (ancestors, descendants) nor anywhere in the
ToC and that the query scored (retrieval's candidates below the top n),
best node score first, then by how many pages link to them. Each related
node is listed once per ToC, under the best hit that links it, so a popular
page costs its tokens once.

Only scored neighbours: on the dev questions, the neighbours the query did
not score (ranked by in-links alone: glossaries, indexes, sitemaps) cost
more than half the cross-links' tokens and reached no gold page the scored
ones missed (benchmarks/RESULTS.md, "The link graph";
benchmarks/cross_links.py measures both).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ritrag.serving.skeleton import Skeleton

MAX_SEE_ALSO = 3  # related nodes per hit: a few handles, not a second ToC
DEFAULT_CROSS_LINKS = True  # GetToC lists them unless asked not to (benchmarks/RESULTS.md, "The link graph")


@dataclass(frozen=True)
class LinkGraph:
    """Node row -> the node rows it links to (out) and that link to it (in),
    as CSRs over node rows, each edge once, neighbours ascending."""

    out_indptr: np.ndarray  # int64, node rows + 1
    out_rows: np.ndarray  # int32
    in_indptr: np.ndarray  # int64, node rows + 1
    in_rows: np.ndarray  # int32

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray]) -> "LinkGraph":
        return cls(arrays["link_out_indptr"], arrays["link_out_rows"], arrays["link_in_indptr"],
                   arrays["link_in_rows"])

    def __len__(self) -> int:
        """The number of edges."""
        return len(self.out_rows)

    def in_degree(self, rows: np.ndarray) -> np.ndarray:
        return self.in_indptr[rows + 1] - self.in_indptr[rows]

    def neighbours(self, row: int) -> np.ndarray:
        """The rows `row` links to or is linked from, ascending, each once."""
        return np.union1d(self.out_rows[self.out_indptr[row]:self.out_indptr[row + 1]],
                          self.in_rows[self.in_indptr[row]:self.in_indptr[row + 1]])


def see_also(hits: Sequence[int], shown: np.ndarray, graph: LinkGraph, skeleton: Skeleton,
             scores: Mapping[int, float], per_hit: int = MAX_SEE_ALSO, unscored: bool = False
             ) -> dict[int, list[int]]:
    """Hit row -> its related rows, best first, for `hits` in rank order.
    `shown`: every row the ToC holds (hits and ancestors), sorted; `scores`:
    node row -> the query's score of each node retrieval scored. A related
    row is a neighbour of the hit outside the hit's chain and outside
    `shown` with a positive score (with `unscored`, any such neighbour,
    those without a score after the others), listed under the first hit that
    has it; ties by in-link count, then row. Array operations per hit, so a
    hub page's thousands of neighbours cost no Python loop."""
    if not len(graph) or per_hit <= 0 or not len(hits):
        return {}
    scored = np.fromiter(scores, np.int64, len(scores))
    order = np.argsort(scored)
    scored, score_of = scored[order], np.fromiter(scores.values(), np.float64, len(scores))[order]
    listed = np.asarray(shown, np.int64)
    out: dict[int, list[int]] = {}
    for hit in hits:
        rows = graph.neighbours(hit)
        rows = rows[~np.isin(rows, listed)]
        at = np.clip(np.searchsorted(scored, rows), 0, max(len(scored) - 1, 0))
        score = np.where(scored[at] == rows, score_of[at], 0.0) if len(scored) else np.zeros(len(rows))
        if not unscored:
            rows, score = rows[score > 0], score[score > 0]
        # A descendant of the hit has it among its ancestors; its ancestors are in `shown`.
        counts, chain = skeleton.ancestor_lists(rows)
        below = np.repeat(np.arange(len(rows)), counts)[chain == hit]
        rows, score = np.delete(rows, below), np.delete(score, below)
        if not len(rows):
            continue
        chosen = rows[np.lexsort((rows, -graph.in_degree(rows), -score))[:per_hit]]
        listed = np.concatenate([listed, chosen])
        out[hit] = chosen.tolist()
    return out
