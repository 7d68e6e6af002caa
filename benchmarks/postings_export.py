"""A loaded version's live postings as one list, for benchmarks that hand the
same terms to another BM25 implementation (bm25_compare.py, lucene_compare.py):
every posting's term id (into one vocabulary), chunk row and tf, sorted by row."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LivePostings:
    vocabulary: list[str]  # term id -> term
    term_row: dict[str, int]  # term -> term id
    terms: np.ndarray  # int64 term id of each posting
    rows: np.ndarray  # int64 chunk row of each posting, ascending
    tf: np.ndarray  # int64


def live_postings(idx) -> LivePostings:
    """The postings of every live chunk row of `idx` (a LoadedVersion), from
    its segments' mapped serving files."""
    term_row: dict[str, int] = {}
    terms, rows, tfs = [], [], []
    for start, shard in zip(idx.chunks.starts, idx.chunks.shards):
        a = shard.arrays
        ids = np.array([term_row.setdefault(t.decode("utf-8"), len(term_row)) for t in a["terms"]], np.int64)
        terms.append(np.repeat(ids, np.diff(a["indptr"])))
        rows.append(a["rows"].astype(np.int64) + start)
        tfs.append(a["tf"].astype(np.int64))
    terms, rows, tf = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (terms, rows, tfs))
    live = idx.chunks.live[rows]
    order = np.argsort(rows[live], kind="stable")
    return LivePostings(list(term_row), term_row, terms[live][order], rows[live][order], tf[live][order])
