"""BM25 top-200 alone: ritrag.bm25 against bm25s over the same chunks and queries.

    python -m benchmarks.bm25_compare INDEX [--queries 200] [--k 200] [--cache_dir DIR]

The index's postings (one field: a synthetic index, or one built with
`--node_docs off`) are handed to bm25s (`pip install bm25s`, the `bench`
extra) as each chunk's analyzed terms, term ids repeated tf times, and indexed
by its public `BM25(method="lucene").index` with the index's k1 and b: the
same terms, idf and length norm as ritrag's (bm25s leaves out the constant
factor k1 + 1, which ranks alike). Queries are node titles drawn with a fixed
seed (as benchmarks/serving.py draws them), analyzed once outside the timings.
Timed per query, one thread: ritrag's `top_k(Bm25.scores(terms), k)` and bm25s's
`retrieve` of one query (its scores over every document, then its top-k
selection); the top-k of both are compared (same rows in the same order, in
the order of equal scores, or other rows). Prints a section for benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import random
import shlex
import sys
import time

import numpy as np
import psutil

from benchmarks.postings_export import live_postings
from benchmarks.results import cpu_description
from ritrag.analyzer import analyze
from ritrag.bm25 import top_k
from ritrag.serving.index import LoadedVersion


def percentiles(seconds: list[float]) -> str:
    ms = np.asarray(seconds) * 1000
    return f"p50 {np.percentile(ms, 50):.2f} ms, p99 {np.percentile(ms, 99):.2f} ms"


def canonical(rows: np.ndarray, scores: np.ndarray) -> list[int]:
    """Rows by score, equal scores (to float32 rounding) by row: two rankers that
    break ties differently give the same list."""
    return [int(r) for _, r in sorted(zip((-np.round(scores / scores.max(), 5)).tolist(), rows.tolist()))]


def bm25s_index(idx: LoadedVersion):
    """A bm25s index of the chunks' terms as `idx`'s postings hold them."""
    import bm25s

    p = live_postings(idx)
    tokens = np.repeat(p.terms, p.tf)
    starts = np.concatenate([[0], np.cumsum(np.bincount(p.rows, weights=p.tf, minlength=len(idx.chunk_ids)))])
    pool = list(range(len(p.vocabulary)))  # one int object per term id, shared by every document
    flat = [pool[t] for t in tokens.tolist()]
    corpus = [flat[int(a):int(b)] for a, b in zip(starts[:-1], starts[1:])]
    del flat
    retriever = bm25s.BM25(k1=idx.bm25.k1, b=idx.bm25.b, method="lucene", idf_method="lucene")
    retriever.index(bm25s.tokenization.Tokenized(ids=corpus, vocab=dict(p.term_row)), show_progress=False)
    return retriever, p.term_row


def main(argv: list[str] | None = None) -> None:
    import bm25s

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("index")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--cache_dir")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    idx = LoadedVersion(args.index, cache_dir=args.cache_dir)
    if "all" not in idx.bm25.fields:
        raise SystemExit("an index with node documents scores two fields; bm25s has one")
    rng = random.Random(0)
    titles = idx.nodes["title"]
    picked = [titles[rng.randrange(len(titles))] for _ in range(args.queries * 2)]
    queries = [analyze(t) for t in dict.fromkeys(picked) if analyze(t)][:args.queries]

    start = time.perf_counter()
    retriever, term_row = bm25s_index(idx)
    bm25s_index_s = time.perf_counter() - start
    rss = psutil.Process().memory_info().rss

    ours, theirs, same, tie_orders, boundary_ties = [], [], 0, 0, 0
    for terms in queries[:10]:  # warm both
        top_k(idx.bm25.scores(terms), args.k)
        retriever.retrieve([[term_row[t] for t in terms]], k=args.k, show_progress=False, n_threads=1)
    for terms in queries:
        ids = [term_row[t] for t in terms]
        t0 = time.perf_counter()
        rows, scores = top_k(idx.bm25.scores(terms), args.k)
        t1 = time.perf_counter()
        docs, their_scores = retriever.retrieve([ids], k=args.k, show_progress=False, n_threads=1)
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        theirs.append(t2 - t1)
        docs, their_scores = docs[0][their_scores[0] > 0], their_scores[0][their_scores[0] > 0]
        if list(rows) == list(docs):
            same += 1
        elif canonical(rows, scores) == canonical(docs, their_scores):
            tie_orders += 1
        else:  # other rows: do they differ only among rows tied with the k-th score?
            all_rows, all_scores = idx.bm25.scores(terms)
            ours_of = dict(zip(all_rows.tolist(), all_scores.tolist()))
            kth = float(scores[-1])
            differing = set(rows.tolist()) ^ set(docs.tolist())
            boundary_ties += all(ours_of.get(r) == kth for r in differing)
    ratio = np.median(ours) / np.median(theirs)
    command = "python -m benchmarks.bm25_compare " + shlex.join(argv or sys.argv[1:])
    print("\n".join([
        f"### BM25 top-{args.k} alone: ritrag.bm25 vs bm25s {bm25s.__version__} "
        f"({len(idx.chunk_ids):,} chunks, {len(idx.postings):,} postings)", "",
        f"`{command}`", "",
        f"Machine: {cpu_description()} (shared with other jobs); load average {load_before:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end", "",
        f"- ritrag.bm25 (postings of the query terms only): {percentiles(ours)}",
        f"- bm25s `retrieve` of one query, numpy backend, 1 thread: {percentiles(theirs)}",
        f"- median ritrag/bm25s: {ratio:.2f}; {len(queries)} queries (node titles, "
        f"{np.mean([len(q) for q in queries]):.1f} terms on average)",
        f"- top-{args.k} of both: the same rows in the same order for {same} queries; the same ranking up to "
        f"the order of equal scores for {tie_orders}; other rows for {len(queries) - same - tie_orders}, of which "
        f"{boundary_ties} only among rows tied with the {args.k}th score",
        f"- bm25s indexing of the same terms: {bm25s_index_s:.1f} s; process RSS after it {rss / 2**30:.2f} GiB",
    ]))


if __name__ == "__main__":
    main()
