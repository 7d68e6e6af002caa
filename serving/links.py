"""Cross-links in GetToC: for each retrieved node, a few related nodes that
its trees do not show, taken from the link graph (the edges table, issue #30).

The ToC shows a hit inside its ancestor chain; what the pages themselves link
to, or are linked from, sits elsewhere in the forest, often in another
chapter or version. `LinkGraph` answers a node's live links from the
segments' link arrays (ritrag/serving_form.py, mapped as written); `see_also`
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

import numpy as np
import pyarrow as pa

from ritrag.ids import node_keys, shard_of
from ritrag.reader import IndexReader, LiveFile
from ritrag.schema import EDGES_KIND
from ritrag.serving_form import IN_LINK_ARRAYS, LINK_ARRAYS
from ritrag.serving.segments import SegmentShards
from ritrag.serving.skeleton import NodeRows, Skeleton

_ONE = np.uint64(1)
MAX_SEE_ALSO = 3  # related nodes per hit: a few handles, not a second ToC
DEFAULT_CROSS_LINKS = True  # GetToC lists them unless asked not to (benchmarks/RESULTS.md, "The link graph")


def _ranges(sorted_ids: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the positions in `sorted_ids` of the entries equal to each of `keys`,
    concatenated; the index in `keys` of each)."""
    # Integer keys: the entries equal to k end where k + 1 would start (one
    # search for both ends; no array holds NO_NODE_KEY, whose k + 1 wraps to 0).
    # Few calls per array, as a query asks this of every shard for a few keys.
    n = len(keys)
    bounds = sorted_ids.searchsorted(np.concatenate((keys, keys + _ONE)))
    lo = bounds[:n]
    counts = np.maximum(bounds[n:] - lo, 0)
    owner = np.arange(n).repeat(counts)
    return (lo - counts.cumsum() + counts).repeat(counts) + np.arange(len(owner)), owner


class ShardLinks:
    """The link arrays of one shard of a segment (ritrag.serving_form: node
    keys, mapped from its serving file), and the sources whose edges later
    segments tombstoned (sorted keys: an edge is live unless its source was
    tombstoned). `edges`: the shard's edges file, which holds the edges of
    the sources it owns (ritrag.reader.LiveFile.owns); `owns_targets`: its
    in-links are those of the targets it owns (IN_LINK_ARRAYS), else, as a
    file written before those holds them, those of its own edges (any
    target's: LINK_ARRAYS)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], dead_sources: frozenset, edges: LiveFile | None = None,
                 owns_targets: bool = False):
        self.edges, self.owns_targets = edges, owns_targets
        self.out_source, self.out_target = arrays["link_out_source"], arrays["link_out_target"]
        self.in_target, self.in_source = (arrays[name] for name in (IN_LINK_ARRAYS if owns_targets
                                                                    else LINK_ARRAYS[2:]))
        dead = [s.encode("utf-8") for s in dead_sources]
        self.dead = np.sort(node_keys(np.array(dead, dtype=bytes))) if dead else np.zeros(0, np.uint64)

    def _live(self, sources: np.ndarray) -> np.ndarray:
        return ~np.isin(sources, self.dead) if len(self.dead) else np.ones(len(sources), bool)

    def _in_links(self, keys: np.ndarray, owned: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(the live sources linking to each of `keys` here, concatenated; the index in `keys` of each)."""
        asked = np.arange(len(keys)) if owned is None or not self.owns_targets else np.flatnonzero(owned)
        at, owner = _ranges(self.in_target, keys[asked])
        sources = self.in_source[at]
        live = self._live(sources)
        return sources[live], asked[owner[live]]

    def links_of(self, keys: np.ndarray, owned: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(the keys each of `keys` links to or is linked from by a live edge
        here, concatenated; the index in `keys` of each). `owned`: which of
        `keys` this shard owns (None: all): only theirs can have out-links
        here, and, where it `owns_targets`, in-links."""
        asked = np.arange(len(keys)) if owned is None else np.flatnonzero(owned)
        out_at, out_owner = _ranges(self.out_source, keys[asked])
        out_owner = asked[out_owner]
        out_owner_live = self._live(keys)[out_owner] if len(self.dead) else np.ones(len(out_owner), bool)
        sources, in_owner = self._in_links(keys, owned)
        return (np.concatenate([self.out_target[out_at[out_owner_live]], sources]),
                np.concatenate([out_owner[out_owner_live], in_owner]))

    def in_counts(self, keys: np.ndarray, owned: np.ndarray | None = None) -> np.ndarray:
        """How many live sources link to each of `keys` here (`owned`: as for `links_of`)."""
        return np.bincount(self._in_links(keys, owned)[1], minlength=len(keys))


class LinkGraph:
    """Node row -> the live node rows it links to (out) and that link to it
    (in), each once, answered by binary search in every segment shard's link
    arrays, as written by the job that wrote the segment (mapped, shared by the
    versions a process holds): a new version derives nothing, and a query's
    cost follows the hits it asks about (a search per shard). An edge counts
    when both its nodes are live rows and its source's edges are live; a
    node's in-degree counts its live edges (each source once)."""

    def __init__(self, shards: list[ShardLinks], skeleton: Skeleton):
        """`skeleton`: the version's node rows (their ids, keys and id map)."""
        self._shards, self._node_ids = shards, skeleton.columns["node_id"]
        self._node_key, self._node_row = skeleton.node_key, skeleton.node_row
        self.edge_rows = sum(len(s.out_source) for s in shards)  # stored pairs, dead ones too

    @classmethod
    def of(cls, reader: IndexReader, segments: list[SegmentShards], skeleton: Skeleton) -> "LinkGraph":
        """The link graph of a loaded version: every edges file's link arrays,
        from the serving file of its segment and shard."""
        mapped = {(segment.segment, number): shard for segment in segments
                  for number, shard in enumerate(segment.shards)}
        def shard(edges: LiveFile) -> ShardLinks:
            arrays, owns_targets = mapped[edges.segment, edges.shard].links(edges)
            return ShardLinks(arrays, edges.dead, edges, owns_targets)

        return cls([shard(f) for f in reader.files(EDGES_KIND)], skeleton)

    def __len__(self) -> int:
        """The number of stored (source, target) pairs, live or not: 0 when the version has no links."""
        return self.edge_rows

    def _owned(self, rows: np.ndarray) -> list[np.ndarray | None]:
        """Per shard, which of `rows` it owns (ritrag.ids.shard_of, as the jobs
        shard the edges table and the in-links); None where it is not known."""
        ids = self._node_ids.take(pa.array(rows)).to_pylist()
        owner = {n: np.array([shard_of(i, n) for i in ids], np.int64)
                 for n in {s.edges.num_shards for s in self._shards if s.edges is not None}}
        return [owner[s.edges.num_shards] == s.edges.shard if s.edges is not None else None for s in self._shards]

    def in_degree(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        keys = self._node_key[rows]
        return sum((s.in_counts(keys, owned) for s, owned in zip(self._shards, self._owned(rows))),
                   np.zeros(len(keys), np.int64))

    def neighbour_pairs(self, rows: np.ndarray, among: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
        """(i, neighbour) pairs, each once, ordered by i then neighbour: the
        rows that rows[i] links to or is linked from, one search per shard
        for all of `rows`. `among`: live node rows; when given, only
        neighbours among them are listed, found in them rather than among
        every node (a hub's thousands of neighbours against a query's few
        hundred scored nodes)."""
        rows = np.asarray(rows, np.int64)
        keys = self._node_key[rows]
        # A node's out-links are in the one shard of each segment that owns it, and so
        # are its in-links (in files written since they were sharded by target).
        found = [s.links_of(keys, owned) for s, owned in zip(self._shards, self._owned(rows))]
        ids = np.concatenate([f[0] for f in found]) if found else np.zeros(0, np.uint64)
        owner = np.concatenate([f[1] for f in found]) if found else np.zeros(0, np.int64)
        if among is None:
            linked = self._node_row.rows(ids) if len(ids) else np.zeros(0, np.int64)
        else:
            among = np.asarray(among, np.int64)
            linked = NodeRows.of(self._node_key[among], among).rows(ids)
        keep = (linked >= 0) & (linked != rows[owner])
        pairs = np.unique(owner[keep] * (len(self._node_ids) + 1) + linked[keep])
        return np.divmod(pairs, len(self._node_ids) + 1)

    def neighbours(self, row: int) -> np.ndarray:
        """The rows `row` links to or is linked from, ascending, each once."""
        return self.neighbour_pairs(np.array([row]))[1]


def see_also(hits: Sequence[int], shown: np.ndarray, graph: LinkGraph, skeleton: Skeleton,
             scores: Mapping[int, float], per_hit: int = MAX_SEE_ALSO, unscored: bool = False
             ) -> dict[int, list[int]]:
    """Hit row -> its related rows, best first, for `hits` in rank order.
    `shown`: every row the ToC holds (hits and ancestors), sorted; `scores`:
    node row -> the query's score of each node retrieval scored. A related
    row is a neighbour of the hit outside the hit's chain and outside
    `shown` with a positive score (with `unscored`, any such neighbour,
    those without a score after the others), listed under the first hit that
    has it; ties by in-link count, then row. The links, ancestors and
    in-degrees (of tied candidates) are asked once for all hits (a search per shard), the rest is
    array operations over all (hit, neighbour) pairs, and Python only walks
    the pairs left, in order, to list each neighbour once (a few hundred: the
    neighbours are the query's scored nodes)."""
    if not len(graph) or per_hit <= 0 or not len(hits):
        return {}
    scored = np.fromiter(scores, np.int64, len(scores))
    order = np.argsort(scored)
    scored, score_of = scored[order], np.fromiter(scores.values(), np.float64, len(scores))[order]

    def score(rows: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(scored, rows), max(len(scored) - 1, 0))
        return np.where(scored[at] == rows, score_of[at], 0.0) if len(scored) else np.zeros(len(rows))

    hits = np.asarray(hits, np.int64)
    hit_of, rows = graph.neighbour_pairs(hits, None if unscored else scored[score_of > 0])
    keep = ~np.isin(rows, np.asarray(shown, np.int64))
    if not unscored:
        keep &= score(rows) > 0
    hit_of, rows = hit_of[keep], rows[keep]
    if not len(rows):
        return {}
    # Every candidate's ancestors and in-degree, asked once for all hits.
    candidates, at = np.unique(rows, return_inverse=True)
    counts, chain = skeleton.ancestor_lists(candidates)
    # A descendant of its hit has the hit among its ancestors (whose own ancestors are in `shown`):
    # the pairs (candidate, ancestor) searched for each (candidate, its hit), as one integer each.
    width = int(max(chain.max(initial=0), hits.max())) + 1
    chained = np.sort(np.repeat(np.arange(len(candidates)), counts) * width + chain)
    pair = at * width + hits[hit_of]
    found = np.minimum(np.searchsorted(chained, pair), max(len(chained) - 1, 0))
    descendant = chained[found] == pair if len(chained) else np.zeros(len(pair), bool)
    hit_of, at = hit_of[~descendant], at[~descendant]
    candidate_score = score(candidates)
    # In-links only break ties of score (the order below), so they are counted for the
    # candidates whose score another candidate shares: a search per shard saved per query.
    _, inverse, ties = np.unique(candidate_score, return_inverse=True, return_counts=True)
    tied = ties[inverse] > 1
    degree = np.zeros(len(candidates), np.int64)
    if tied.any():
        degree[tied] = graph.in_degree(candidates[tied])
    # Each hit's candidates best first (score, then in-links, then row); hits in rank
    # order, each listing its first `per_hit` that no earlier hit listed.
    order = np.lexsort((candidates[at], -degree[at], -candidate_score[at], hit_of))
    listed = np.zeros(len(candidates), bool)
    out: dict[int, list[int]] = {}
    for h, c in zip(hit_of[order].tolist(), at[order].tolist()):
        if listed[c]:
            continue
        chosen = out.setdefault(int(hits[h]), [])
        if len(chosen) < per_hit:
            chosen.append(int(candidates[c]))
            listed[c] = True
    return out
