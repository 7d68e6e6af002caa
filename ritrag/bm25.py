"""BM25 in one place: its parameters, what the jobs record, each field's
statistics, length norms and scoring.

Okapi BM25 with Lucene's idf, ln(1 + (N - df + 0.5) / (df + 0.5)), and the
length norm k1 * (1 - b + b * |d| / avgdl). What each side does:

- The jobs (transforms/sparse.py) record, per segment, the postings (term,
  chunk_id, tf), each term's document frequency in all rows and in each
  field's rows (vocabulary shards) and the segment's chunk and term counts
  (`corpus_stats`, bm25.json), all signed in an update's delta so that sums
  over segments stay exact; then each segment's postings as CSR per shard
  (ritrag/serving_form.py). The build writes `BM25_PARAMETERS` into the
  manifest; the server scores with the manifest's (`parameters`).
- The server maps each segment's CSR and looks a term's postings up in every
  segment (`TermPostings`, ritrag.serving.segments); it derives, once per
  version, each field's statistics (`Field`: df summed over segments, N and
  mean length from the live rows) and every row's length norm (`row_norms`);
  a query is scored over the postings of its own terms only (`Bm25.scores`),
  added into a lent per-row score array (`ScoreAccumulators`), so its cost
  follows the postings it touches, not the corpus; GetToC asks only for the
  top k' (`Bm25.top_k`, `chunk_top_k`), which skips, where the query's
  postings are many, the postings that cannot change it (MaxScore), and
  adds the node fields' scores to chunks per node (`NodeAdditions`).

Fields. An index of chunk bodies only has one field, every chunk, scored with
the recorded statistics (vocabulary df, bm25.json N and mean length). An index
with node or anchor documents (ritrag/representation.py) has one field per kind
of row it holds, each with its own df (recorded per field), N and mean length
(counted from the live rows): chunk bodies ("body"), node documents ("doc",
the path) and anchor documents ("anchors": the anchor texts of a node's in-links).
A chunk scores its body's BM25 + `path_weight` x its node document's BM25 +
`anchor_weight` x its node's anchor document's BM25 (`Bm25.chunk_top_k`);
the node fields are added to the chunks of the matched nodes only. An index
without anchor documents has no "anchors" field and scores exactly as the two
fields did before it existed.

Rankings are bit-identical to scoring every row densely (the form this module
replaced; tests/test_bm25.py keeps it as the oracle): each term's contribution
is computed in float64 from the same float32 norm and added to a float32 score,
term after term in query order, and top-k' breaks ties by chunk id.
"""
from __future__ import annotations

import threading
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numpy as np

from ritrag.representation import ANCHOR_DOC_ORDINAL, NODE_DOC_ORDINAL

# Recorded in every manifest's config; the server scores with the manifest's values.
BM25_PARAMETERS = {"k1": 1.2, "b": 0.75}

Scores = tuple[np.ndarray, np.ndarray]  # (rows, float32 scores): rows in no particular order, or best first after top_k


def corpus_stats(n_chunks: int, n_terms: int) -> dict[str, Any]:
    """A segment's bm25.json: rows and terms indexed (signed in a delta)."""
    return {"n_chunks": n_chunks, "n_terms": n_terms, "avg_chunk_terms": (n_terms / n_chunks) if n_chunks else 0.0}


def idf(n: int, df: int) -> float:
    """Lucene's BM25 idf of a term in `df` of `n` documents (always > 0 for df <= n)."""
    return np.log(1.0 + (n - df + 0.5) / (df + 0.5))


class TermPostings(Protocol):
    """The live postings of a loaded version, by term (ritrag.serving.segments)."""

    chunk_length: np.ndarray  # float32 terms per chunk row

    def of(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(rows ascending, tf) of the live rows holding `term`: each row once."""

    def tf_at(self, term: str, rows: np.ndarray) -> np.ndarray:
        """uint16 tf of `term` in each of `rows` (live, ascending), 0 where
        absent: a binary search per row, not a read of the whole postings."""


class TermCounts(Protocol):
    """A number per term: a field's document frequencies."""

    def get(self, term: str, default: int = 0) -> int: ...


@dataclass(frozen=True)
class Field:
    """One BM25 field: its rows (None: every row), per term the number of
    its rows holding the term, its number of rows, their mean length."""

    member: np.ndarray | None
    df: TermCounts
    n: int
    avg_length: float


# The kind of each row of the chunk arrays, numbered by its place in
# KIND_FIELDS: the field it is scored in.
KIND_FIELDS = ("body", "doc", "anchors")
BODY, DOC, ANCHORS = range(len(KIND_FIELDS))


def row_kind(ordinal: int) -> int:
    """The field of a chunks-table row, by its ordinal (ritrag/representation.py)."""
    return DOC if ordinal == NODE_DOC_ORDINAL else ANCHORS if ordinal == ANCHOR_DOC_ORDINAL else BODY


def row_kinds(ordinals: np.ndarray) -> np.ndarray:
    """`row_kind` of every ordinal, as int8."""
    kind = np.full(len(ordinals), BODY, np.int8)
    kind[ordinals == NODE_DOC_ORDINAL] = DOC
    kind[ordinals == ANCHOR_DOC_ORDINAL] = ANCHORS
    return kind


def row_norms(chunk_length: np.ndarray, fields: Sequence[Field], k1: float, b: float) -> np.ndarray:
    """float32 k1 * (1 - b + b * length / mean length of its field), per row."""
    norm = np.zeros(len(chunk_length), np.float32)
    for field in fields:
        value = k1 * (1.0 - b + b * chunk_length / max(field.avg_length, 1e-9))
        if field.member is None:
            norm[:] = value
        else:
            norm[field.member] = value[field.member]
    return norm


def top_k(scores: Scores, k: int, row_ids: np.ndarray | None = None) -> Scores:
    """The k best rows of positive score, best first, equal scores by row, or
    by `row_ids` (each row's chunk id) when given: an order that does not
    depend on how the version's rows are laid out over its segments."""
    rows, values = scores
    positive = np.flatnonzero(values > 0)
    if len(positive) > k:
        # every row tied with the k-th stays a candidate, so the tie order decides
        kth = np.partition(-values[positive], k - 1)[k - 1]
        positive = positive[-values[positive] <= kth]
    order_key = rows[positive] if row_ids is None else row_ids[rows[positive]]
    chosen = positive[np.lexsort((order_key, -values[positive]))][:k]
    return rows[chosen], values[chosen]


def text_scores(bm25: "Bm25", query_terms: Sequence[str], texts_terms: Sequence[Sequence[str]],
                field: str = "body") -> np.ndarray:
    """BM25 of texts the postings do not hold (a node's passages, cut at read
    time) against a query: the same formula as `Bm25.scores`, with the index's
    idf and mean length of `field` ("all" where the index has one field)."""
    f = bm25.fields.get(field) or bm25.fields["all"]
    weights = {}
    for term, qtf in Counter(query_terms).items():
        df = f.df.get(term, 0)
        if df > 0:
            weights[term] = qtf * idf(f.n, df)
    scores = np.zeros(len(texts_terms), np.float32)
    for i, terms in enumerate(texts_terms):
        counts = Counter(t for t in terms if t in weights)
        norm = bm25.k1 * (1.0 - bm25.b + bm25.b * len(terms) / f.avg_length) if f.avg_length else bm25.k1
        scores[i] = sum(w * counts[t] * (bm25.k1 + 1.0) / (counts[t] + norm) for t, w in weights.items())
    return scores


# Relative slack on MaxScore's comparisons of float32 partial sums (added in
# another order than the exact sums) with bounds: a candidate too many, never one too few.
BOUND_SLACK = 1e-4
THRESHOLD_PASSES = 2
# Below this many postings (the query terms' df summed), adding every posting
# costs less than MaxScore's bookkeeping (a pass over the rows touched for the
# threshold, a second pass to add the candidates' sums in query order):
# measured 2.6 against 4.0 ms p50 on the dev corpus's questions (165k body
# rows), 9.6 against 7.9 ms at 100k synthetic pages (benchmarks/RESULTS.md,
# "BM25 with a lent score array, and MaxScore").
PRUNE_MIN_POSTINGS = 50_000


class ScoreAccumulators:
    """Zeroed float32 arrays of one score per row of a version, lent to one
    query at a time and handed back zeroed.

    A query adds each term's contributions into the array at the rows the
    term's postings name, so scoring costs a gather and a scatter per posting
    touched (no sort or hash of the touched rows, as `np.unique` needed; bm25s
    and PISA accumulate the same way). At most `POOLED` arrays are kept, since
    each is 4 bytes a row; a query beyond them gets a fresh one, which the
    kernel zeroes page by page as it is touched.
    """

    POOLED = 4

    def __init__(self, rows: int):
        self.rows = rows
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    @contextmanager
    def lend(self) -> Iterator["Accumulator"]:
        with self._lock:
            scores = self._free.pop() if self._free else None
        accumulator = Accumulator(np.zeros(self.rows, np.float32) if scores is None else scores)
        yield accumulator  # a query that raises drops its array: it may hold a partial sum
        accumulator.clear()  # rows added but not taken
        with self._lock:
            if len(self._free) < self.POOLED:
                self._free.append(accumulator.scores)


class Accumulator:
    """One lent score array: `add` contributions, `take` the rows touched and
    their sums (the array is zero again after `take`)."""

    def __init__(self, scores: np.ndarray):
        self.scores = scores
        self._touched: list[np.ndarray] = []

    def add(self, rows: np.ndarray, contribution: np.ndarray) -> np.ndarray:
        """Add `contribution` (> 0) at `rows`, each row at most once; return the
        rows it touched first. The sum is float32 + the contribution's dtype,
        stored as float32, term after term: the arithmetic of the dense scorer,
        so rankings stay bit-identical."""
        current = self.scores[rows]
        first = rows[current == 0]  # contributions are > 0: zero means not yet touched
        self._touched.append(first)
        self.scores[rows] = current + contribution
        return first

    def peek(self) -> Scores:
        """(rows touched, in no particular order; their float32 sums so far)."""
        if len(self._touched) != 1:
            self._touched = [np.concatenate(self._touched) if self._touched else np.zeros(0, np.int64)]
        return self._touched[0], self.scores[self._touched[0]]

    def take(self) -> Scores:
        """`peek`, and the array zeroed."""
        scores = self.peek()
        self.clear()
        return scores

    def clear(self) -> None:
        """Zero every row added since the last `take` or `clear`."""
        for rows in self._touched:
            self.scores[rows] = 0
        self._touched = []


@dataclass(frozen=True)
class NodeAdditions:
    """What node fields add to the body chunks of their nodes: per field, in
    the order they are added, (node rows, weight x the node's score > 0), each
    node at most once. `chunk_node`: each chunk row's node row; `node_chunks`:
    (indptr over node rows, body chunk rows), each node's chunks."""

    fields: Sequence[Scores]
    chunk_node: np.ndarray
    node_chunks: tuple[np.ndarray, np.ndarray]


class _NodeBonus:
    """One query's NodeAdditions laid out per node, in lent arrays: each
    field's value and their float32 sum in field order (`total`: what a chunk
    of the node scores without a body term), so that a chunk's addition is a
    gather by its node and no node's value is spread over all its chunks."""

    def __init__(self, additions: NodeAdditions, fields: list[Accumulator], total: Accumulator):
        self.chunk_node = additions.chunk_node
        self.indptr, self.node_rows = additions.node_chunks
        self.fields = fields
        for array, (nodes, values) in zip(fields, additions.fields):
            array.add(nodes, values)
            total.add(nodes, values)
        self.total = total

    def seeds(self, k: int) -> tuple[np.ndarray, float]:
        """(the chunk rows of the nodes whose totals are the k largest, ties
        included; the largest total of any other node, 0 if none). Each such
        node has a chunk, so they hold at least k chunks, each scoring at least
        its node's total: no chunk of another node scores more than the
        second number unless a body term adds to it."""
        nodes, totals = self.total.peek()
        counts = self.indptr[nodes + 1] - self.indptr[nodes]
        with_chunks = counts > 0
        nodes, totals, counts = nodes[with_chunks], totals[with_chunks], counts[with_chunks]
        rest = 0.0
        if len(nodes) > k:
            seed = totals >= np.partition(totals, len(totals) - k)[len(totals) - k]
            if not seed.all():
                rest = float(totals[~seed].max())
            nodes, counts = nodes[seed], counts[seed]
        starts = np.repeat(self.indptr[nodes] - np.cumsum(counts) + counts, counts)
        return self.node_rows[starts + np.arange(counts.sum())].astype(np.int64), rest

    def total_at(self, rows: np.ndarray) -> np.ndarray:
        """Each chunk row's node total (0 where its node has none)."""
        return self.total.scores[self.chunk_node[rows]]

    def add_fields(self, accumulator: Accumulator, rows: np.ndarray) -> None:
        """Add each field's value of their node to `rows` (each at most once), field after field."""
        nodes = self.chunk_node[rows]
        for field in self.fields:
            values = field.scores[nodes]
            has = values > 0
            accumulator.add(rows[has], values[has])


class _ReadOnce:
    """`TermPostings` of one query: each term's postings read from `postings` once."""

    def __init__(self, postings: TermPostings):
        self._postings, self._read = postings, {}
        self.chunk_length = postings.chunk_length

    def of(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        if term not in self._read:
            self._read[term] = self._postings.of(term)
        return self._read[term]

    def tf_at(self, term: str, rows: np.ndarray) -> np.ndarray:
        return self._postings.tf_at(term, rows)


class Bm25:
    """A loaded index's BM25: the postings, its fields (one, or one per row
    kind), and every row's length norm (each with its own field's mean
    length), computed once."""

    def __init__(self, postings: TermPostings, fields: Mapping[str, Field], k1: float, b: float,
                 norm: np.ndarray | None = None):
        self.postings, self.fields, self.k1, self.b = postings, dict(fields), k1, b
        self.norm = row_norms(postings.chunk_length, list(self.fields.values()), k1, b) if norm is None else norm
        self.accumulators = ScoreAccumulators(len(self.norm))
        # per number of node rows: arrays of a value per node, lent to a query's additions
        self._node_accumulators: dict[int, ScoreAccumulators] = {}
        self._node_accumulators_lock = threading.Lock()
        self.prune_min_postings = PRUNE_MIN_POSTINGS

    def scores(self, terms: Sequence[str], field: str = "all") -> Scores:
        """(rows, float32 scores) of the rows of `field` holding a query term,
        in no particular order: the only rows whose BM25 is not 0."""
        with self.accumulators.lend() as accumulator:
            self._add_field(accumulator, terms, field)
            return accumulator.take()

    def _add_field(self, accumulator: Accumulator, terms: Sequence[str], field: str,
                   postings: TermPostings | None = None) -> None:
        """Add each query term's BM25 in `field`, term after term in query order."""
        f = self.fields[field]
        for term in self._weighted(terms, f):
            accumulator.add(*self._term(term, f, postings))

    def _weighted(self, terms: Sequence[str], f: Field) -> list[tuple[str, float, int]]:
        """(term, qtf x idf, df) of each distinct query term that some row of `f` holds, in query order."""
        weighted = []
        for term, qtf in Counter(terms).items():
            df = f.df.get(term, 0)
            if df > 0:
                weighted.append((term, qtf * idf(f.n, df), df))
        return weighted

    def top_k(self, terms: Sequence[str], field: str, k: int, row_ids: np.ndarray | None = None,
              additions: NodeAdditions | None = None) -> Scores:
        """`top_k` of the rows' BM25 in `field` plus `additions` (each row's
        node's value of each node field, added after the terms in their order,
        field after field), bit for bit, without adding every posting of every
        term: MaxScore (Turtle and Flood 1995) in term-at-a-time form.

        A term adds at most qtf x idf x (k1 + 1) to any row (tf / (tf + norm) < 1).
        Terms are added in the order of that bound, largest first, to partial
        sums; once the bounds of the terms left sum below the k-th best partial
        sum, no row they alone hold can reach the top k, so only the rows whose
        partial sum plus that bound reaches it stay candidates, and the terms
        left are looked up at those rows by binary search in their postings
        instead of read whole. The candidates' exact sums are then added again
        in query order, so the scores are those of adding every posting. A
        query whose terms hold fewer than `prune_min_postings` postings adds
        them all (PRUNE_MIN_POSTINGS says why).

        The additions stay per node (a common word in a site's node documents
        matches every node of the site): the partial sums start from the
        chunks of the nodes with the k largest additions (`_NodeBonus.seeds`),
        a chunk a term reaches gets its node's addition then, and no other
        chunk can outscore those seeds."""
        with self.accumulators.lend() as partial, self.accumulators.lend() as exact:
            return self._top_k(partial, exact, terms, field, k, row_ids, additions)

    @contextmanager
    def _node_bonus(self, additions: NodeAdditions | None) -> Iterator["_NodeBonus | None"]:
        """`additions` laid out per node in arrays lent for the query (None: nothing to add)."""
        if additions is None or not any(len(nodes) for nodes, _ in additions.fields):
            yield None
            return
        nodes = len(additions.node_chunks[0]) - 1
        with self._node_accumulators_lock:
            if nodes not in self._node_accumulators:
                self._node_accumulators[nodes] = ScoreAccumulators(nodes)
            pool = self._node_accumulators[nodes]
        with ExitStack() as lent:
            fields = [lent.enter_context(pool.lend()) for _ in additions.fields]
            yield _NodeBonus(additions, fields, lent.enter_context(pool.lend()))

    def _top_k(self, partial: Accumulator, exact: Accumulator, terms: Sequence[str], field: str, k: int,
               row_ids: np.ndarray | None, additions: NodeAdditions | None, postings: TermPostings | None = None
               ) -> Scores:
        f = self.fields[field]
        query = self._weighted(terms, f)
        with self._node_bonus(additions) as bonus:
            if sum(df for *_, df in query) < self.prune_min_postings:
                for term in query:
                    partial.add(*self._term(term, f, postings))
                if bonus is not None:
                    seeds, _ = bonus.seeds(k)
                    touched, _ = partial.peek()
                    bonus.add_fields(partial, np.concatenate([touched, seeds[partial.scores[seeds] == 0]]))
                return top_k(partial.take(), k, row_ids)
            bounds = [weight * (self.k1 + 1.0) for _, weight, _ in query]
            # Partial sums hold the additions of the seeds and of every row a term reaches;
            # no other row's addition exceeds `rest`.
            rest, reachable = 0.0, 0.0
            if bonus is not None:
                seeds, rest = bonus.seeds(k)
                partial.add(seeds, bonus.total_at(seeds))
                reachable = float(bonus.total.peek()[1].max())
            left, threshold, read, passes = sum(bounds), 0.0, {}, 0
            for i in sorted(range(len(query)), key=lambda i: -bounds[i]):
                if left + rest < threshold * (1 - BOUND_SLACK):
                    break
                rows, contribution = self._term(query[i], f, postings)
                first = partial.add(rows, contribution)
                if bonus is not None:
                    partial.scores[first] += bonus.total_at(first)
                read[i] = rows, contribution
                left -= bounds[i]
                reachable += bounds[i]
                # The k-th best partial sum costs a pass over every row touched: taken
                # only where it could stop the loop (no partial sum exceeds `reachable`),
                # and at most `THRESHOLD_PASSES` times (a stale threshold only prunes less).
                if left + rest < reachable and passes < THRESHOLD_PASSES:
                    _, sums = partial.peek()
                    if len(sums) >= k:
                        threshold = float(np.partition(sums, len(sums) - k)[len(sums) - k])
                        passes += 1
            touched, sums = partial.peek()
            # Only the rows whose partial sum plus the bounds left reach the threshold
            # can be in the top k; their exact sums are added again in query order.
            # `partial` keeps them (and only them) non-zero as the candidates' mask.
            # A row no term read scores at most `rest` + `left`: below the threshold
            # once the loop stopped early, below the seeds when every term was read.
            partial.scores[touched[sums + left < threshold * (1 - BOUND_SLACK)]] = 0
            candidates = touched[partial.scores[touched] > 0]
            in_order = False
            for i, (term, weight, _) in enumerate(query):
                if i in read:
                    rows, contribution = read[i]
                    kept = partial.scores[rows] > 0
                    exact.add(rows[kept], contribution[kept])
                else:
                    if not in_order:  # a binary search in the postings wants them in order
                        candidates, in_order = np.sort(candidates), True
                    tf = (postings or self.postings).tf_at(term, candidates)
                    hit = np.flatnonzero(tf)
                    tf = tf[hit]
                    exact.add(candidates[hit], weight * tf * (self.k1 + 1.0) / (tf + self.norm[candidates[hit]]))
            if bonus is not None:
                bonus.add_fields(exact, candidates)
            partial.clear()
            return top_k(exact.take(), k, row_ids)

    def _term(self, term: tuple[str, float, int], f: Field, postings: TermPostings | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(rows ascending, float64 BM25) of one weighted query term's postings in
        field `f`, read from `postings` (default: the index's)."""
        word, weight, _ = term
        rows, tf = (postings or self.postings).of(word)
        if f.member is not None:
            keep = f.member[rows]
            rows, tf = rows[keep], tf[keep]
        return rows, weight * tf * (self.k1 + 1.0) / (tf + self.norm[rows])

    def chunk_top_k(self, terms: Sequence[str], weights: Mapping[str, float], chunk_node: np.ndarray,
                    node_chunks: tuple[np.ndarray, np.ndarray], k: int, row_ids: np.ndarray | None = None
                    ) -> tuple[Scores, dict[str, Scores]]:
        """(the top k chunks, each weighted node field's own scores) of an
        index with node fields: a chunk scores its body's BM25 + `weights[f]` x
        the BM25 of its node's row of field f, for each node field f ("doc",
        "anchors") in `weights` that the index has, in that order; a field of
        weight 0 is not scored at all. `node_chunks`: (indptr over node rows,
        body chunk rows) of each node; a node has at most one row of each node
        field. The node fields are scored whole (their rows are one per node);
        the bodies through `top_k`, with the node fields as its additions."""
        # A term's postings hold every kind of row: read once for the node fields and the bodies.
        postings = _ReadOnce(self.postings)
        with self.accumulators.lend() as accumulator:
            own = {}
            for name, weight in weights.items():
                if name in self.fields and weight > 0:
                    self._add_field(accumulator, terms, name, postings)
                    own[name] = accumulator.take()
            fields = []
            for name, (field_rows, values) in own.items():
                matched = values > 0
                fields.append((chunk_node[field_rows[matched]], weights[name] * values[matched]))
            additions = NodeAdditions(fields, chunk_node, node_chunks)
            with self.accumulators.lend() as exact:
                return self._top_k(accumulator, exact, terms, "body", k, row_ids, additions, postings), own
