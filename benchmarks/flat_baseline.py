"""A flat RAG retriever over a corpus folder, as the reference ritrag's retrieval must beat.

    python benchmarks/flat_baseline.py --corpus DIR --questions Q.jsonl [--out OUT.json]
        [--words 180] [--k 200] [--n 50] [--model bundled:all-MiniLM-L6-v2] [--dtype auto]
        [--fusion rrf [minmax]]

It knows nothing of the forest and reads no ritrag index: every HTML file
under DIR is one page; its main text (ritrag's parser, so both retrievers see
the same words) is cut into windows of `--words` words, each prefixed with
the page's HTML <title>; BM25 is bm25s (English stop words, Snowball
stemming) and dense is exact inner product of the same embedding model's
vectors; the two top-k chunk lists are fused by RRF (k = 60), a page scores
its best chunk, and the top-n pages are the ranking. `--fusion rrf minmax`
also ranks with ritrag's default fusion (min-max normalized scores, equal
weights) from the same chunks and vectors, so a comparison can tell the
forest's share from the fusion's; the report holds one block per fusion.
Gold entries are paths relative to DIR's parent layout (`product/page.html`); a question whose gold
lies in no page of DIR is left out. Metrics as `ritrag eval` computes them
for its rankings: rank of the first gold page within the top n, hit@1,
hit@5, MRR, overall and per tag (lookalike, half:a, half:b, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ritrag.embedder import DEFAULT_MODEL, EmbedderSpec, available_cpus  # noqa: E402
from ritrag.encoders import load_encoder  # noqa: E402
from ritrag.serving.retrieval import RRF_K, minmax_fusion, reciprocal_rank_fusion  # noqa: E402
from ritrag.transforms.parse import UnparseablePage, parse_page  # noqa: E402

FUSIONS = {"rrf": lambda rankings: reciprocal_rank_fusion([rows for rows, _ in rankings], RRF_K),
           "minmax": minmax_fusion}
EMBED_SLICE = 8192  # chunks per progress line; the encoder sorts by length within a slice


def html_title(data: bytes) -> str:
    import lxml.html

    try:
        titles = lxml.html.fromstring(data).xpath("//title")
    except (ValueError, lxml.etree.ParserError):
        return ""
    return " ".join(titles[0].text_content().split()) if titles else ""


def flat_chunks(corpus: str, words: int) -> tuple[list[str], list[str]]:
    """(page of each chunk, chunk texts): `words`-word windows of each page's
    main text, the page's <title> first."""
    pages, texts = [], []
    for directory, _, names in sorted(os.walk(corpus)):
        for name in sorted(names):
            if not name.lower().endswith((".html", ".htm")):
                continue
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, corpus).replace(os.sep, "/")
            data = open(path, "rb").read()
            try:
                page = parse_page(data, "http://localhost/" + relative, "http://localhost/")
            except UnparseablePage:
                continue
            title = html_title(data) or page.title
            body = page.body.split()
            for start in range(0, max(len(body), 1), words):
                pages.append(relative)
                texts.append(f"{title}\n{' '.join(body[start: start + words])}".strip())
    return pages, texts


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--words", type=int, default=180)
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                    help="the encoder's dtype, as the build's --embed_dtype (compare like with like)")
    ap.add_argument("--fusion", nargs="+", default=["rrf"], choices=sorted(FUSIONS),
                    help="fusions to rank with (each from the same chunks and vectors)")
    args = ap.parse_args(argv)
    import bm25s
    import Stemmer

    started = time.time()
    pages, texts = flat_chunks(args.corpus, args.words)
    known = set(pages)
    print(f"{len(known)} pages, {len(texts)} chunks in {time.time() - started:.0f} s", flush=True)
    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    spec = EmbedderSpec(model=args.model)
    # The build's CPU setting (one torch thread per batch, a batch per CPU), so
    # that both retrievers' vectors come from the same arithmetic.
    encoder = load_encoder(spec, dtype=args.dtype, cpu_parallelism=available_cpus())
    t0 = time.time()
    parts = []
    for start in range(0, len(texts), EMBED_SLICE):  # slices, for progress lines on a long run
        parts.append(encoder.embed(texts[start: start + EMBED_SLICE], spec.document_prefix).vectors)
        done, elapsed = min(start + EMBED_SLICE, len(texts)), time.time() - t0
        print(f"embedded {done:,} of {len(texts):,} chunks in {elapsed:.0f} s ({done / elapsed:.1f}/s), "
              f"ETA {(len(texts) - done) * elapsed / done:.0f} s", flush=True)
    vectors = np.concatenate(parts) if parts else np.empty((0, encoder.dimension), np.float32)
    page_of = np.array(pages, dtype=object)

    questions = [json.loads(line) for line in open(args.questions, encoding="utf-8") if line.strip()]
    questions = [q for q in questions if any(g in known for g in q["gold"])]
    query_vectors = encoder.embed([q["question"] for q in questions], spec.query_prefix).vectors
    k = min(args.k, len(texts))
    results: dict[str, list[dict]] = {name: [] for name in args.fusion}
    for q, qv in zip(questions, query_vectors):
        docs, scores = retriever.retrieve(bm25s.tokenize([q["question"]], stopwords="en", stemmer=stemmer,
                                                         show_progress=False), k=k, show_progress=False)
        matched = scores[0] > 0
        sims = vectors @ qv
        dense = np.lexsort((np.arange(len(sims)), -sims))[:k]
        rankings = [(docs[0][matched], scores[0][matched]), (dense, sims[dense])]
        gold = set(q["gold"])
        for name in args.fusion:
            best: dict[str, float] = {}
            for chunk, score in FUSIONS[name](rankings).items():
                page = page_of[chunk]
                best[page] = max(best.get(page, 0.0), score)
            ranking = [p for p, _ in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))][: args.n]
            rank = next((i for i, p in enumerate(ranking, start=1) if p in gold), None)
            results[name].append({"id": q["id"], "tags": q.get("tags", []), "rank": rank})

    def summary(rows: list[dict]) -> dict:
        ranks = [r["rank"] for r in rows]
        return {"questions": len(rows),
                "mrr": float(np.mean([1.0 / r if r else 0.0 for r in ranks])) if rows else None,
                "hit@1": float(np.mean([r == 1 for r in ranks])) if rows else None,
                "hit@5": float(np.mean([r is not None and r <= 5 for r in ranks])) if rows else None}

    tags = sorted({t for q in questions for t in q.get("tags", [])})
    report = {"corpus": args.corpus, "pages": len(known), "chunks": len(texts), "words": args.words,
              "model": args.model, "dtype": args.dtype, "k": args.k, "n": args.n,
              "fusions": {name: {"overall": summary(rows),
                                 "by_tag": {t: summary([r for r in rows if t in r["tags"]]) for t in tags},
                                 "questions": rows} for name, rows in results.items()},
              "seconds": round(time.time() - started, 1)}
    print(json.dumps({key: report[key] for key in ("pages", "chunks")}), flush=True)
    for name, block in report["fusions"].items():
        print(name, "all", json.dumps(block["overall"]), flush=True)
        for tag in ("lookalike", "half:a", "half:b"):
            if tag in block["by_tag"]:
                print(name, tag, json.dumps(block["by_tag"][tag]), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
    return report


if __name__ == "__main__":
    main()
