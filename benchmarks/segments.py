"""GetToC as updates pile up segments, and after compaction, in one run.

    python -m benchmarks.segments --pages 10000 [--work /tmp/bench-segments] [--queries 200]

`ritrag synth --pages N` built with `--embedding_model hashing:384` (the
default representation), then `ritrag update` runs, each editing a few pages,
until the version has 4 and then 16 segments; then `ritrag compact` makes one.
At 1, 4, 16 segments and compacted, GetToC is timed in process on the same
queries (node titles), retrieval only (the query vector given, so the
embedder is not measured): p50 and p99, and each p50 over the 1-segment one.
The answers of the 16-segment version and its compacted form are compared.
"""
from __future__ import annotations

import argparse
import os
import random
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np

from benchmarks.results import cpu_description, write_section

EDIT = b" Revised by update {n} of the segments benchmark.</p>"


def ritrag(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "ritrag.cli", *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def edit_pages(pages: str, n: int, count: int = 3) -> None:
    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(pages) for f in files if f.endswith(".html"))
    for path in random.Random(n).sample(paths, count):
        with open(path, "rb") as fh:
            data = fh.read()
        with open(path, "wb") as fh:
            fh.write(data.replace(b"</p>", EDIT.replace(b"{n}", str(n).encode()), 1))


def timed_tocs(index: str, queries: list[str]) -> tuple[np.ndarray, list]:
    from ritrag.serving.api import RitragIndex, one_thread_per_query

    one_thread_per_query()  # as `ritrag serve` runs: FAISS's threads make a flat shard's search 2x slower here
    idx = RitragIndex(index)
    vectors = [idx.embed_query(q) for q in queries]
    for q, v in zip(queries[:20], vectors):  # warm
        idx.get_toc(q, query_vector=v)
    seconds, answers = [], []
    for q, v in zip(queries, vectors):
        start = time.perf_counter()
        toc = idx.get_toc(q, query_vector=v)
        seconds.append(time.perf_counter() - start)
        answers.append(toc["trees"])
    return np.array(seconds), answers


def titles(index: str, count: int) -> list[str]:
    from ritrag.serving.api import RitragIndex

    idx = RitragIndex(index)
    rows = random.Random(0).sample(range(len(idx.loaded.nodes["title"])), count)
    return [idx.loaded.nodes["title"][r] for r in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--work", default="/tmp/bench-segments")
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args(argv)
    pages, index = os.path.join(args.work, "pages"), os.path.join(args.work, "index")
    shutil.rmtree(args.work, ignore_errors=True)
    ritrag("synth", "--pages", str(args.pages), "--out", pages)
    ritrag("build", pages, "--out", index, "--embedding_model", "hashing:384")
    queries = titles(index, args.queries)
    load = os.getloadavg()[0]
    measured = {}
    updates = 0
    for segments in (1, 4, 16):
        while updates + 1 < segments:
            updates += 1
            edit_pages(pages, updates)
            ritrag("update", pages, "--index", index)
        measured[f"{segments} segment{'s' if segments > 1 else ''}"] = timed_tocs(index, queries)
    compacted = os.path.join(args.work, "compacted")
    shutil.copytree(index, compacted)
    ritrag("compact", compacted)
    measured["compacted (1 segment)"] = timed_tocs(compacted, queries)
    same = sum(a == b for a, b in zip(measured["16 segments"][1], measured["compacted (1 segment)"][1]))
    base = np.median(measured["1 segment"][0])
    rows = [f"| {name} | {np.median(s) * 1000:.2f} | {np.percentile(s, 99) * 1000:.2f} | {np.median(s) / base:.2f} |"
            for name, (s, _) in measured.items()]
    body = "\n".join([
        f"## GetToC as updates add segments (benchmarks/segments.py): {args.pages:,} synthetic pages",
        "",
        f"Machine: {cpu_description()}; load average {load:.1f} before timing. Command: "
        f"`python -m benchmarks.segments {shlex.join(argv or sys.argv[1:])}`. Index: `ritrag synth` + `ritrag build "
        f"--embedding_model hashing:384` (default representation); each update edits 3 pages; "
        f"{len(queries)} node-title queries, retrieval only (query vector given), in process.",
        "",
        "| version | p50 ms | p99 ms | p50 / 1 segment |",
        "|---|---|---|---|",
        *rows,
        "",
        f"16 segments and their compacted form give the same ToC on {same} of {len(queries)} queries.",
    ])
    write_section("benchmarks/segments.py", f"{args.pages} pages", body)
    print(body)


if __name__ == "__main__":
    main()
