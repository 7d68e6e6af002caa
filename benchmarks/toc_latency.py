"""Retrieval-only GetToC latency and memory per process, this checkout beside a
baseline checkout, in one run.

    python -m benchmarks.toc_latency INDEX [INDEX ...] --cache_dir DIR [--baseline CHECKOUT] [--queries 200]
        [--baseline_indexes INDEX ...]   # what the baseline serves instead (its writer's form of the corpus)

For each index, one fresh process per code path and round (rounds alternate
baseline and current, each going first in every other round, so both see the
same machine load and page cache): the index is loaded
from `--cache_dir` (built by a first, untimed load of each code path), then
GetToC runs with the query vector given (retrieval alone: BM25, dense search,
fusion, sub-forest; no query embedding), queries being node titles drawn with
a fixed seed and vectors the embedding-like query vectors of the synthetic
indexes (benchmarks/synthetic_index.py's `SyntheticEmbeddings`, drawn here and
handed to every process), the same in every process. Each process reports its load time, its resident memory after the
queries split as /proc reports it: anonymous (its own heap: what one more
process costs) and file-backed (mapped files: pages the page cache shares
between the processes that map them), and
a digest of all its answers, so the paths are shown to answer alike.

`--baseline` is another checkout of ritrag (a `git worktree` of an earlier
commit): its `ritrag` package and folders are imported in place of this
checkout's, as the editable install maps them (setup.py's package_dir).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import subprocess
import sys
import time

import numpy as np

HERE = os.path.abspath(__file__)
WARM_UP = 10
K_PRIME = 200  # GetToC's default chunks per retriever (serving/api.py DEFAULT_K)


def measure(index_dir: str, cache_dir: str, vectors_path: str, timed: bool) -> dict:
    """Runs in the worker process: load, then the retrieval-only GetToC of every query."""
    from ritrag.serving.api import RitragIndex, one_thread_per_query

    one_thread_per_query()
    start = time.perf_counter()
    index = RitragIndex(index_dir, cache_dir=cache_dir)
    load_s = time.perf_counter() - start
    if not timed:
        return {"load_s": load_s}
    vectors = np.load(vectors_path)
    rng = random.Random(0)
    titles = index.loaded.nodes["title"]
    picked = [titles[rng.randrange(len(titles))] for _ in range(len(vectors) * 2)]
    queries = [t for t in dict.fromkeys(picked) if t.strip()][:len(vectors)]
    for query, vector in zip(queries[:WARM_UP], vectors):
        index.get_toc(query, query_vector=vector)
    seconds, digest = [], hashlib.sha256()
    for query, vector in zip(queries, vectors):
        t0 = time.perf_counter()
        toc = index.get_toc(query, query_vector=vector)
        seconds.append(time.perf_counter() - t0)
        digest.update(json.dumps(toc["trees"], sort_keys=True).encode())
    search_s, rerank_s = dense_alone(index.loaded, vectors[:len(queries)])
    with open("/proc/self/status", encoding="ascii") as fh:
        status = {k: v.split()[0] for k, v in (line.split(":", 1) for line in fh) if k in ("RssAnon", "RssFile")}
    return {"load_s": load_s, "seconds": seconds, "search_s": search_s, "rerank_s": rerank_s,
            "anon": int(status["RssAnon"]) * 1024, "file": int(status["RssFile"]) * 1024,
            "digest": digest.hexdigest()[:16], "chunks": len(index.loaded.chunk_ids), "queries": len(queries)}


def dense_alone(idx, vectors: np.ndarray) -> tuple[list[float], list[float]]:
    """Seconds of GetToC's dense side per query, as serving/api.py runs it for a
    one-field index (k' = 200): the index search, then the exact re-ranking (0
    when the index asks for none)."""
    from ritrag.serving.retrieval import dense_top_k
    from ritrag.vectors import rerank_exact

    search_s, rerank_s = [], []
    for vector in vectors:
        t0 = time.perf_counter()
        candidates, _ = dense_top_k(vector, idx.dense_shards, idx.dense_rerank * K_PRIME, idx.dense_params)
        t1 = time.perf_counter()
        if idx.vector_store is not None:
            rerank_exact(vector, candidates, idx.vector_store)
        search_s.append(t1 - t0)
        rerank_s.append(time.perf_counter() - t1)
    return search_s, rerank_s


def run_worker(code: str | None, index_dir: str, cache_dir: str, vectors_path: str, timed: bool) -> dict:
    """`measure` in a fresh process, importing ritrag from `code` (None: this checkout)."""
    shim = (f"import sys; sys.path.insert(0, {code!r}); import ritrag; ritrag.__path__.append({code!r}); "
            if code else "import sys; ")
    script = (shim + f"import runpy; m = runpy.run_path({HERE!r}); import json; "
              f"print(json.dumps(m['measure']({index_dir!r}, {cache_dir!r}, {vectors_path!r}, {timed})))")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(HERE)))
    return json.loads(out.stdout.strip().splitlines()[-1])


def query_vectors(index_dir: str, count: int, directory: str) -> str:
    """`count` query vectors of the index's dimension, saved in `directory` (a .npy file)."""
    from benchmarks.synthetic_index import QUERY_STREAM, SyntheticEmbeddings
    from ritrag.layout import IndexLayout

    dim = IndexLayout(index_dir).load_manifest().settings.dense.dim
    path = os.path.join(directory, f"toc_latency_queries-{dim}-{count}.npy")
    os.makedirs(directory, exist_ok=True)
    np.save(path, SyntheticEmbeddings(dim=dim).batch(QUERY_STREAM, count).astype(np.float32))
    return path


def percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = np.asarray(seconds) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def main(argv: list[str] | None = None) -> None:
    from benchmarks.results import cpu_description

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("indexes", nargs="+")
    parser.add_argument("--cache_dir", required=True)
    parser.add_argument("--baseline", help="another ritrag checkout (a git worktree) measured beside this one")
    parser.add_argument("--baseline_indexes", nargs="+", metavar="INDEX",
                        help="with --baseline: the index the baseline serves in place of each of `indexes` (the same "
                             "corpus as the baseline's writer wrote it, when a default of the on-disk form changed)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if args.baseline_indexes and (not args.baseline or len(args.baseline_indexes) != len(args.indexes)):
        parser.error("--baseline_indexes needs --baseline and one index per index")
    paths = ([("baseline", args.baseline)] if args.baseline else []) + [("current", None)]
    load_before = os.getloadavg()[0]
    lines, p50 = [], {}
    for i, index_dir in enumerate(args.indexes):
        served = {"baseline": args.baseline_indexes[i] if args.baseline_indexes else index_dir, "current": index_dir}
        vectors_path = query_vectors(index_dir, args.queries, args.cache_dir)
        for name, code in paths:  # build each path's cache, untimed
            run_worker(code, served[name], args.cache_dir, vectors_path, timed=False)
        runs: dict[str, list[dict]] = {name: [] for name, _ in paths}
        for round_ in range(args.rounds):
            # Who goes first alternates: the first process of a round finds the pages the
            # other left in the page cache least, and the first round finds the fewest.
            for name, code in (paths if round_ % 2 == 0 else paths[::-1]):
                runs[name].append(run_worker(code, served[name], args.cache_dir, vectors_path, timed=True))
        for name, results in runs.items():
            seconds = [s for r in results for s in r["seconds"]]
            median, p99 = percentiles(seconds)
            p50[(index_dir, name)] = median
            first = results[0]
            lines.append(f"- {served[name]}, {first['chunks']:,} chunks, {name}: GetToC retrieval only p50 {median:.1f} ms, "
                         f"p99 {p99:.1f} ms ({len(seconds)} calls in {len(results)} processes); load from the "
                         f"cache {np.median([r['load_s'] for r in results]):.1f} s; per process resident anonymous "
                         f"{max(r['anon'] for r in results) / 2**30:.2f} GiB + file-backed "
                         f"{max(r['file'] for r in results) / 2**30:.2f} GiB; answers digest "
                         f"{', '.join(sorted({r['digest'] for r in results}))}")
            if "search_s" in first:
                search_ms = 1e3 * np.median([s for r in results for s in r["search_s"]])
                rerank_ms = 1e3 * np.median([s for r in results for s in r["rerank_s"]])
                lines.append(f"  - dense side alone, medians: index search {search_ms:.2f} ms + exact re-ranking "
                             f"{rerank_ms:.2f} ms")
        if args.baseline:
            lines.append(f"  - baseline/current p50: {p50[(index_dir, 'baseline')] / p50[(index_dir, 'current')]:.1f}x")
    for name, _ in paths:
        medians = [p50[(i, name)] for i in args.indexes]
        if len(medians) > 1:
            steps = ", ".join(f"{after / before:.2f}" for before, after in zip(medians, medians[1:]))
            lines.append(f"- {name}: p50 ratio of each index to the one before it {steps}; "
                         f"last/first {medians[-1] / medians[0]:.2f}")
    command = "python -m benchmarks.toc_latency " + shlex.join(argv or sys.argv[1:])
    print("\n".join([f"`{command}`", "",
                     f"Machine: {cpu_description()}; load average {load_before:.1f} at "
                     f"start, {os.getloadavg()[0]:.1f} at end", "", *lines]))


if __name__ == "__main__":
    main()
