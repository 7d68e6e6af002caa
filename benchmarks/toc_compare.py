"""GetToC on real questions, this checkout beside a baseline checkout, in one
run: in-process latency with and without cross-links, and whether the two
code paths give the same answers.

    python -m benchmarks.toc_compare INDEX QUESTIONS.jsonl --baseline CHECKOUT [--rounds 2] [--queries 120]

Each round runs, for each code path in turn (so both see the same machine
load), one fresh process that loads INDEX, embeds the questions once (the
timings are retrieval only: the query vector given), warms up on 20 of them,
then times `get_toc` over `--queries` questions with cross-links on and off,
and digests every question's trees (JSON, keys sorted). Medians of each
round's p50 and p99; the digests must match for the answers to be the same.

`--baseline` is another checkout of ritrag (a `git worktree` of an earlier
commit), imported in place of the installed package as in
benchmarks/cold_start.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.cold_start import command_prefix

CHILD = r"""
import hashlib, json, sys, time
import numpy as np
from ritrag.serving.api import RitragIndex, one_thread_per_query
index_path, questions_path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
one_thread_per_query()  # as `ritrag serve` runs
index = RitragIndex(index_path)
questions = [json.loads(line)["question"] for line in open(questions_path) if line.strip()]
vectors = [index.embed_query(q) for q in questions]
digest = hashlib.sha256()
for q, v in zip(questions, vectors):
    digest.update(json.dumps(index.get_toc(q, query_vector=v)["trees"], sort_keys=True).encode())
out = {"digest": digest.hexdigest()[:16], "questions": len(questions)}
for cross_links in (True, False):
    for q, v in zip(questions[:20], vectors):
        index.get_toc(q, query_vector=v, cross_links=cross_links)
    seconds = []
    for q, v in zip(questions[:count], vectors):
        start = time.perf_counter()
        index.get_toc(q, query_vector=v, cross_links=cross_links)
        seconds.append(time.perf_counter() - start)
    out[f"cross_links_{cross_links}"] = [float(np.median(seconds)) * 1000, float(np.percentile(seconds, 99)) * 1000]
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("index")
    parser.add_argument("questions", help="JSONL with a 'question' per line (benchmarks/questions/dev.jsonl)")
    parser.add_argument("--baseline", required=True, help="another ritrag checkout (a git worktree)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--queries", type=int, default=120)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {"baseline": [], "current": []}
    for _ in range(args.rounds):
        for name, code in (("baseline", args.baseline), ("current", None)):
            child = command_prefix(code) + CHILD
            out = subprocess.run([sys.executable, "-c", child, os.path.abspath(args.index),
                                  os.path.abspath(args.questions), str(args.queries)],
                                 check=True, capture_output=True, text=True, cwd="/").stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"index {args.index}, {runs['current'][0]['questions']} questions ({args.queries} timed), "
          f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f} at the end")
    for name, results in runs.items():
        for cross_links in (True, False):
            key = f"cross_links_{cross_links}"
            p50 = statistics.median(r[key][0] for r in results)
            p99 = statistics.median(r[key][1] for r in results)
            print(f"  {name:8s} cross-links {'on ' if cross_links else 'off'}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    digests = {name: {r["digest"] for r in results} for name, results in runs.items()}
    print(f"  answers: baseline {sorted(digests['baseline'])}, current {sorted(digests['current'])}: "
          f"{'identical' if digests['baseline'] == digests['current'] and len(digests['current']) == 1 else 'DIFFER'}")


if __name__ == "__main__":
    main()
