"""Full builds of synthetic corpora at growing sizes: wall time, pages/s, peak RSS.

    python -m benchmarks.build_scale --pages 10000 100000 [--workers 2] [--model hashing:384]

Corpora come from `ritrag synth` (cached under --work). By default the embedding
stage is swapped for the cheap deterministic `hashing:384` vectorizer, so that
the figures isolate parse, forest, chunk, BM25, dense indexing and writing;
embedding throughput is measured on its own by benchmarks/embed.py. Every row
says which model it used. The ratio of the largest to the next size tells
whether time grows linearly (target: time(1M) / time(100k) <= 11).
"""
from __future__ import annotations

import argparse
import logging
import os
import resource
import shutil
import sys
import time

from benchmarks.results import ProcessTreeMemory, cpu_description, write_section
from ritrag.pipelines import build
from ritrag.layout import IndexLayout
from ritrag.evaluation.synth import SynthConfig, generate_corpus


def corpus(work: str, pages: int) -> str:
    path = os.path.join(work, f"corpus-{pages}")
    done = path + ".complete"  # beside the corpus, or the build would read it as a page
    if not os.path.exists(done):
        shutil.rmtree(path, ignore_errors=True)
        generate_corpus(path, SynthConfig(pages=pages))
        open(done, "w").close()
    return path


def run_one(work: str, pages: int, model: str, workers: int, shards: int) -> dict:
    source = corpus(work, pages)
    index = os.path.join(work, f"index-{pages}")
    shutil.rmtree(index, ignore_errors=True)
    argv = ["--input", source, "--out", index, "--site_depth", "1", "--base_url", "https://synth.example/",
            "--embedding_model", model, "--num_shards", str(shards), "--keep_versions", "1"]
    if workers > 1:
        argv += ["--direct_running_mode", "multi_processing", "--direct_num_workers", str(workers)]
    with ProcessTreeMemory() as memory:
        started, cpu_before = time.perf_counter(), cpu_seconds()
        build.run(argv)
        wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu_before
    stats = IndexLayout(index).load_manifest().stats
    return {"pages": pages, "wall_s": wall, "pages_per_s": pages / wall, "cpu_s": cpu,
            "chunks": stats["bm25"]["n_chunks"], "peak_gib": memory.peak_total / 2 ** 30,
            "memory": memory.summary(3), "model": model}


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children: on a shared
    machine, less disturbed by other work than the wall time."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--model", default="hashing:384",
                        help="embedding model of the builds (default: the cheap hashing vectorizer)")
    parser.add_argument("--workers", type=int, default=1, help="in-process runner worker processes")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--work", default="/tmp/bench-scale")
    args = parser.parse_args(argv)
    rows = [run_one(args.work, n, args.model, args.workers, args.shards) for n in sorted(args.pages)]
    lines = [
        "## Build scaling on synthetic corpora (benchmarks/build_scale.py)", "",
        f"Machine: {cpu_description()}. Command: `python -m benchmarks.build_scale "
        f"{' '.join(argv or sys.argv[1:])}`.",
        f"Embedding stage: `{args.model}`" + (" (a deterministic hashing vectorizer standing in for the model, "
                                              "so these figures exclude model inference; see the embedding "
                                              "benchmark)" if args.model.startswith("hashing:") else "") + ".",
        f"Runner: FnApiRunner, {args.workers} worker process(es), {args.shards} shards.", "",
        "| pages | chunks | wall s | pages/s | CPU s | peak RSS (process tree) |", "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['pages']:,} | {r['chunks']:,} | {r['wall_s']:.1f} | {r['pages_per_s']:.1f} | "
              f"{r['cpu_s']:.1f} | {r['peak_gib']:.2f} GiB |" for r in rows]
    for small, large in zip(rows, rows[1:]):
        lines.append(f"\ntime({large['pages']:,}) / time({small['pages']:,}) = "
                     f"**{large['wall_s'] / small['wall_s']:.2f}** for {large['pages'] / small['pages']:.0f}x the pages.")
    lines.append("\nLargest processes: " + "; ".join(f"{r['pages']:,} pages: {r['memory']}" for r in rows))
    body = "\n".join(lines)
    print(body)
    write_section("benchmarks/build_scale.py", f"{args.model} x{args.workers}", body)


if __name__ == "__main__":
    # force: importing Beam has already configured the root logger (at WARNING)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    main()
