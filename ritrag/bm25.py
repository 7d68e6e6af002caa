"""BM25 in one place: its parameters, what the jobs record, each field's
statistics, length norms and scoring.

Okapi BM25 with Lucene's idf, ln(1 + (N - df + 0.5) / (df + 0.5)), and the
length norm k1 * (1 - b + b * |d| / avgdl). What each side does:

- The jobs (transforms/sparse.py) record, per segment, the postings (term,
  chunk_id, tf), each term's document frequency (vocabulary shards) and the
  segment's chunk and term counts (`corpus_stats`, bm25.json; signed in an
  update's delta, so sums over segments stay exact). The build writes
  `BM25_PARAMETERS` into the manifest; the server scores with the manifest's
  (`parameters`).
- The server holds every posting as CSR over terms (`Postings`) and derives,
  once at load, each field's statistics (`Field`) and every row's length norm
  (`row_norms`); a query is scored over the postings of its own terms only
  (`Bm25.scores`), so its cost follows the postings it touches, not the corpus.

Fields. An index without node documents has one field, every chunk, scored
with the recorded statistics (vocabulary df, bm25.json N and mean length). An
index with node documents (ritrag/representation.py) has two, each with its own
df, N and mean length counted from the live postings: chunk bodies ("body")
and node documents ("doc", the path). A chunk scores its body's BM25 +
`path_weight` x its node document's BM25 (`Bm25.chunk_and_doc_scores`); the
path is added to the chunks of the matched nodes only.

Rankings are bit-identical to scoring every row densely (the form this module
replaced; tests/test_bm25.py keeps it as the oracle): each term's contribution
is computed in float64 from the same float32 norm and added to a float32 score,
term after term in query order, and top-k' runs the same partition over the
positive rows in row order.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

# Recorded in every manifest's config; the server scores with the manifest's values.
BM25_PARAMETERS = {"k1": 1.2, "b": 0.75}

Scores = tuple[np.ndarray, np.ndarray]  # (rows, float32 scores): rows sorted, or best first after top_k


def parameters(config: Mapping[str, Any]) -> tuple[float, float]:
    """(k1, b): a manifest config's recorded values over the defaults."""
    recorded = {**BM25_PARAMETERS, **config.get("bm25", {})}
    return recorded["k1"], recorded["b"]


def corpus_stats(n_chunks: int, n_terms: int) -> dict[str, Any]:
    """A segment's bm25.json: rows and terms indexed (signed in a delta)."""
    return {"n_chunks": n_chunks, "n_terms": n_terms, "avg_chunk_terms": (n_terms / n_chunks) if n_chunks else 0.0}


def idf(n: int, df: int) -> float:
    """Lucene's BM25 idf of a term in `df` of `n` documents (always > 0 for df <= n)."""
    return np.log(1.0 + (n - df + 0.5) / (df + 0.5))


@dataclass(frozen=True)
class Postings:
    """Every live posting as CSR over terms: the postings of the term of row
    `term_row[t]` are entries indptr[row]:indptr[row + 1], sorted by chunk row
    within each shard."""

    term_row: Mapping[str, int]
    indptr: np.ndarray  # int64, terms + 1
    chunk_index: np.ndarray  # int32 row in the chunk arrays
    tf: np.ndarray  # uint16 term frequency (float32 accepted)
    chunk_length: np.ndarray  # float32 terms per chunk row


@dataclass(frozen=True)
class Field:
    """One BM25 field: its rows (None: every row), per term row the number of
    its rows holding the term, its number of rows, their mean length."""

    member: np.ndarray | None
    df: np.ndarray
    n: int
    avg_length: float


def two_fields(postings: Postings, is_doc: np.ndarray, body_df: np.ndarray | None = None,
               doc_df: np.ndarray | None = None) -> tuple[Field, Field]:
    """(body, doc) fields of an index with node documents (`is_doc` per row),
    statistics counted from the live postings themselves (one posting per term
    and row), so they stay exact after updates. `body_df`/`doc_df`: the same
    counts cached by an earlier load (`field_df`)."""
    if body_df is None or doc_df is None:
        body_df, doc_df = field_df(postings, is_doc)
    out = []
    for member, df in ((~is_doc, body_df), (is_doc, doc_df)):
        n = int(member.sum())
        out.append(Field(member, df, n, float(postings.chunk_length[member].sum() / n) if n else 0.0))
    return out[0], out[1]


def field_df(postings: Postings, is_doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(body df, doc df) per term row, from one pass over the postings."""
    in_doc = is_doc[postings.chunk_index].astype(np.int64)

    def per_term(counts: np.ndarray) -> np.ndarray:
        cumulative = np.concatenate([[0], np.cumsum(counts)])
        return cumulative[postings.indptr[1:]] - cumulative[postings.indptr[:-1]]

    doc_df = per_term(in_doc)
    return np.diff(postings.indptr) - doc_df, doc_df


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


def top_k(scores: Scores, k: int) -> Scores:
    """The k best rows of positive score, best first, equal scores by row."""
    rows, values = scores
    positive = np.flatnonzero(values > 0)
    if len(positive) > k:
        positive = positive[np.argpartition(-values[positive], k - 1)[:k]]
    chosen = positive[np.lexsort((rows[positive], -values[positive]))]
    return rows[chosen], values[chosen]


def text_scores(bm25: "Bm25", query_terms: Sequence[str], texts_terms: Sequence[Sequence[str]],
                field: str = "body") -> np.ndarray:
    """BM25 of texts the postings do not hold (a node's passages, cut at read
    time) against a query: the same formula as `Bm25.scores`, with the index's
    idf and mean length of `field` ("all" where the index has one field)."""
    f = bm25.fields.get(field) or bm25.fields["all"]
    weights = {}
    for term, qtf in Counter(query_terms).items():
        row = bm25.postings.term_row.get(term)
        df = 0 if row is None else int(f.df[row])
        if df > 0:
            weights[term] = qtf * idf(f.n, df)
    scores = np.zeros(len(texts_terms), np.float32)
    for i, terms in enumerate(texts_terms):
        counts = Counter(t for t in terms if t in weights)
        norm = bm25.k1 * (1.0 - bm25.b + bm25.b * len(terms) / f.avg_length) if f.avg_length else bm25.k1
        scores[i] = sum(w * counts[t] * (bm25.k1 + 1.0) / (counts[t] + norm) for t, w in weights.items())
    return scores


class Bm25:
    """A loaded index's BM25: the postings, its one or two fields, and every
    row's length norm (each with its own field's mean length), computed once."""

    def __init__(self, postings: Postings, fields: Mapping[str, Field], k1: float, b: float,
                 norm: np.ndarray | None = None):
        self.postings, self.fields, self.k1, self.b = postings, dict(fields), k1, b
        self.norm = row_norms(postings.chunk_length, list(self.fields.values()), k1, b) if norm is None else norm

    def scores(self, terms: Sequence[str], field: str = "all") -> Scores:
        """(rows, float32 scores) of the rows of `field` holding a query term,
        rows ascending: the only rows whose BM25 is not 0."""
        f, p = self.fields[field], self.postings
        touched = []
        for term, qtf in Counter(terms).items():
            row = p.term_row.get(term)
            df = 0 if row is None else int(f.df[row])
            if df <= 0:
                continue
            lo, hi = p.indptr[row], p.indptr[row + 1]
            rows, tf = p.chunk_index[lo:hi], p.tf[lo:hi]
            if f.member is not None:
                keep = f.member[rows]
                rows, tf = rows[keep], tf[keep]
            touched.append((rows, tf, qtf * idf(f.n, df)))
        if not touched:
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        rows, inverse = np.unique(np.concatenate([t[0] for t in touched]), return_inverse=True)
        scores = np.zeros(len(rows), np.float32)
        start = 0
        for term_rows, tf, weight in touched:  # a term holds a row once: no repeated index below
            at = inverse[start:start + len(term_rows)]
            start += len(term_rows)
            scores[at] += weight * tf * (self.k1 + 1.0) / (tf + self.norm[term_rows])
        return rows, scores

    def chunk_and_doc_scores(self, terms: Sequence[str], path_weight: float, chunk_node: np.ndarray,
                             node_chunks: tuple[np.ndarray, np.ndarray]) -> tuple[Scores, Scores]:
        """(chunk scores, node document scores) of a two-field index: a chunk
        scores its body's BM25 + `path_weight` x its node document's BM25; a
        node document its own BM25. `node_chunks`: (indptr over node rows, body
        chunk rows) of each node; a node has at most one document."""
        body_rows, body = self.scores(terms, "body")
        doc_rows, doc = self.scores(terms, "doc")
        if path_weight <= 0:
            return (body_rows, body), (doc_rows, doc)
        matched = doc > 0
        nodes, path = chunk_node[doc_rows[matched]], doc[matched]
        indptr, node_rows = node_chunks
        counts = indptr[nodes + 1] - indptr[nodes]
        starts = np.repeat(indptr[nodes] - np.cumsum(counts) + counts, counts)
        path_rows = node_rows[starts + np.arange(counts.sum())]
        rows = np.union1d(body_rows, path_rows)
        scores = np.zeros(len(rows), np.float32)
        scores[np.searchsorted(rows, body_rows)] = body
        scores[np.searchsorted(rows, path_rows)] += path_weight * np.repeat(path, counts)
        return (rows, scores), (doc_rows, doc)
