"""How far two indexes of the same pages agree on GetToC: the overlap of their hit nodes.

    python benchmarks/toc_overlap.py INDEX_A INDEX_B --questions sample/questions.jsonl [MORE.jsonl ...]
        [--limit 20] [--dtype_a float32] [--dtype_b auto] [--label TEXT] [--no-record]

Made to check that an index embedded with another arithmetic (say bfloat16,
`--embed_dtype`) answers like the float32 one: both indexes must hold the same
pages (node ids are stable, so the same page gets the same id in both).
Each index's queries are embedded with that index's model in `--dtype_a` /
`--dtype_b` (as a server on a machine whose `auto` is that dtype would), then
each question's top-n hit nodes (the nodes GetToC's sub-forest is built
around, with the index's recorded retrieval parameters) are compared:
overlap@n = |A and B| / n, the same best node, and the Jaccard index of the
two sets. Results go to stdout and to this script's section of
benchmarks/RESULTS.md, keyed by `--label`.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.results import cpu_description, write_section  # noqa: E402
from ritrag.encoders import load_encoder  # noqa: E402
from ritrag.serving.api import DEFAULT_K, DEFAULT_N, RitragIndex  # noqa: E402


def hit_nodes(index: RitragIndex, questions: list[str], dtype: str, k: int, n: int,
              ) -> tuple[list[list[str]], str]:
    """Each question's hit node ids, best first, its query embedded in `dtype`;
    and the dtype that `auto` resolved to."""
    spec = index.loaded.manifest.settings.index.embedder
    embedded = load_encoder(spec, "cpu", dtype=dtype).embed(questions, spec.query_prefix)
    node_ids = index.loaded.nodes["node_id"]
    return [[str(node_ids[row]) for row, _ in index.retrieve(q, k, n, vector).hits]
            for q, vector in zip(questions, embedded.vectors)], embedded.dtype


def overlap(a: list[str], b: list[str], n: int) -> tuple[float, bool, float]:
    """(|a and b| / n, same best hit, Jaccard index)."""
    common = len(set(a) & set(b))
    union = len(set(a) | set(b))
    return common / n, bool(a and b and a[0] == b[0]), common / union if union else 1.0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index_a")
    ap.add_argument("index_b")
    ap.add_argument("--questions", required=True, nargs="+",
                    help="JSONL files with a 'question' field per line (no gold needed), read in order")
    ap.add_argument("--limit", type=int, default=20, help="the first N questions of the files")
    ap.add_argument("--dtype_a", default="float32", help="query arithmetic for INDEX_A")
    ap.add_argument("--dtype_b", default="auto", help="query arithmetic for INDEX_B")
    ap.add_argument("--k", type=int, default=DEFAULT_K)
    ap.add_argument("--n", type=int, default=DEFAULT_N)
    ap.add_argument("--label", default=None, help="RESULTS.md section key (default: the two index paths)")
    ap.add_argument("--no-record", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args(argv)
    questions: list[str] = []
    for path in args.questions:
        with open(path, encoding="utf-8") as fh:
            questions.extend(json.loads(line)["question"] for line in fh if line.strip())
    questions = questions[:args.limit]
    (hits_a, dtype_a), (hits_b, dtype_b) = (
        hit_nodes(RitragIndex(path), questions, dtype, args.k, args.n)
        for path, dtype in ((args.index_a, args.dtype_a), (args.index_b, args.dtype_b)))
    per_question = [overlap(a, b, args.n) for a, b in zip(hits_a, hits_b)]
    at_n, same_best, jaccard = (np.array(column, dtype=float) for column in zip(*per_question))
    summary = {"questions": len(questions), "n": args.n, "overlap_at_n_mean": float(at_n.mean()),
               "overlap_at_n_min": float(at_n.min()), "same_best_hit": float(same_best.mean()),
               "jaccard_mean": float(jaccard.mean())}
    command = "python benchmarks/toc_overlap.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    label = args.label or f"{args.index_a} vs {args.index_b}"
    body = "\n".join([
        f"## GetToC hit-node overlap: {label}", "",
        f"- command: `{command.strip()}`",
        f"- machine: {cpu_description()}",
        f"- A: {args.index_a}, queries in {dtype_a}; B: {args.index_b}, queries in {dtype_b}; "
        f"{len(questions)} questions from {', '.join(args.questions)}, top-{args.n} hit nodes of k={args.k} "
        "chunks", "",
        f"| overlap@{args.n} mean | overlap@{args.n} min | same best node | Jaccard mean |",
        "|---|---|---|---|",
        f"| {summary['overlap_at_n_mean']:.3f} | {summary['overlap_at_n_min']:.3f} "
        f"| {summary['same_best_hit']:.0%} | {summary['jaccard_mean']:.3f} |",
    ])
    print(body)
    if not args.no_record:
        write_section("benchmarks/toc_overlap.py", label, body)
    return summary


if __name__ == "__main__":
    main()
