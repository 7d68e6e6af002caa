"""Where the build's CPU goes: one in-process build under cProfile, its time
by Beam stage and by function.

    python -m benchmarks.build_profile --pages 3000 [--work DIR] [--top 25]
    python -m benchmarks.build_profile --input /work/corpus-subset [--base_url URL]

Without --input the corpus is `ritrag synth`'s (cached under --work). The build
is `ritrag.pipelines.build.run` with the `hashing:384` stand-in for the model, on
Beam's in-process FnApiRunner, whose bundles run in the calling thread, so one
profiler sees every DoFn. Without --base_url the sites' bases are inferred
(the head pass runs), as for a mirror.

Stages are the DoFns (and the functions the Beam steps of pipelines/build.py
call) named in STAGES, each timed inclusively: the time of its entry
functions with everything they call. "of which" rows are parts of the row above.
What no stage claims is Beam's own work (the runner, coders, shuffles in
memory, progress), reading matched files and the launcher. Profiled time is
the profiler's clock (CPU-bound, one thread) inflated by its per-call
overhead, so the shares, not the seconds, are the figures to compare; the
process CPU time of the same run is printed beside it.
"""
from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import resource
import shutil
import sys
import time
from typing import NamedTuple

from benchmarks.build_scale import corpus
from benchmarks.results import cpu_description
from ritrag.pipelines import build

Function = tuple[str, str]  # (end of the file's path, function name) as cProfile records it


class Stage(NamedTuple):
    label: str
    entries: tuple[Function, ...]  # their inclusive times add up (none calls another)
    part_of: str | None = None  # a row it is a part of


# The build's steps (pipelines/build.py) by the functions they run.
STAGES = (
    Stage("site bases: head pass (InferSiteBases)", (("transforms/site_base.py", "process"),)),
    Stage("declared URLs of the head", (("transforms/parse/declared.py", "declared_page_urls"),),
          "site bases: head pass (InferSiteBases)"),
    Stage("parse (ParsePages)", (("transforms/pages.py", "process"),)),
    Stage("skeletons, page sources (Forest)", (("ritrag/schema.py", "of"),)),
    Stage("forest placement (PlaceSite)", (("transforms/nodes.py", "place_site"),)),
    Stage("node rows (NodeRows)", (("transforms/nodes.py", "process"),)),
    Stage("re-read + second parse", (("transforms/pages.py", "reread_page"),), "node rows (NodeRows)"),
    Stage("chunk (Chunk)", (("transforms/chunk.py", "process"),)),
    Stage("tokenizer", (("transforms/chunk.py", "count"),), "chunk (Chunk)"),
    Stage("representation (path, render, node doc)",
          (("ritrag/representation.py", "render"), ("ritrag/representation.py", "node_doc")), "chunk (Chunk)"),
    Stage("chunk ids, text hashes", (("ritrag/ids.py", "chunk_id_for"), ("ritrag/ids.py", "content_hash")),
          "chunk (Chunk)"),
    Stage("sparse: analyze, df (Sparse)",
          (("transforms/sparse.py", "chunk_terms"), ("transforms/sparse.py", "process"),
           ("transforms/sparse.py", "finish_bundle"))),
    Stage("analyzer", (("ritrag/analyzer.py", "analyze"),), "sparse: analyze, df (Sparse)"),
    Stage("tables: spill, sort, write (WriteShards)",
          (("transforms/tables.py", "process"), ("transforms/tables.py", "finish_bundle"),
           ("transforms/tables.py", "write_bytes"))),
    Stage("postings tables", (("transforms/sparse.py", "postings_table"),
                              ("transforms/sparse.py", "write_postings_file")),
          "tables: spill, sort, write (WriteShards)"),
    Stage("dense shards, vector files", (("transforms/dense.py", "write_dense_shard"),),
          "tables: spill, sort, write (WriteShards)"),
    Stage("embed: hashing stand-in (Embed)", (("transforms/embed.py", "run_inference"),)),
    Stage("dense: train (Dense)", (("transforms/dense.py", "_train"),)),
)


def matches(key: tuple[str, int, str], function: Function) -> bool:
    return key[0].endswith(function[0]) and key[2] == function[1]


def inclusive(stats: pstats.Stats, functions: tuple[Function, ...]) -> float:
    """Inclusive seconds of every profiled function matching one of `functions`."""
    return sum(row[3] for key, row in stats.stats.items() if any(matches(key, f) for f in functions))


def stage_rows(stats: pstats.Stats) -> list[tuple[str, float, bool]]:
    """(label, inclusive seconds, is a part) per stage, then what no stage claims."""
    rows = [(s.label, inclusive(stats, s.entries), s.part_of is not None) for s in STAGES]
    claimed = sum(t for _, t, part in rows if not part)
    return rows + [("Beam runner, reading, launcher (the rest)", stats.total_tt - claimed, False)]


def hot_functions(stats: pstats.Stats, top: int) -> list[tuple[str, int, float, float]]:
    """(function, calls, own seconds, inclusive seconds), the `top` by own time."""
    ranked = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [(f"{short_path(file)}:{line} {name}", row[1], row[2], row[3]) for (file, line, name), row in ranked]


def short_path(path: str) -> str:
    """A profiled file as its package-relative path."""
    for marker in ("site-packages/", "/main/", "/work/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def profile_build(input_dir: str, out: str, base_url: str | None, shards: int) -> tuple[pstats.Stats, float, float]:
    """(stats, profiled wall seconds, process CPU seconds) of one build."""
    shutil.rmtree(out, ignore_errors=True)
    argv = ["--input", input_dir, "--out", out, "--site_depth", "1", "--embedding_model", "hashing:384",
            "--num_shards", str(shards), "--keep_versions", "1"]
    if base_url:
        argv += ["--base_url", base_url]
    profiler = cProfile.Profile()
    cpu_before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    profiler.runcall(build.run, argv)
    wall, cpu_after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return pstats.Stats(profiler), wall, cpu


def report(stats: pstats.Stats, wall: float, cpu: float, pages: int, chunks: int, top: int) -> str:
    total = stats.total_tt
    lines = [f"{pages:,} pages, {chunks:,} chunks; profiled {total:.1f} s ({wall:.1f} s wall, "
             f"{cpu:.1f} s process CPU)", "",
             "| stage | profiled s | share | ms per page |", "|---|---|---|---|"]
    for label, seconds, part in stage_rows(stats):
        name = f"&nbsp;&nbsp;of which {label}" if part else label
        lines.append(f"| {name} | {seconds:.1f} | {seconds / total:.1%} | {1000 * seconds / pages:.2f} |")
    lines += ["", f"Hot functions (own time, top {top}):", "",
              "| function | calls | own s | inclusive s |", "|---|---|---|---|"]
    lines += [f"| {name} | {calls:,} | {own:.2f} | {incl:.2f} |" for name, calls, own, incl in
              hot_functions(stats, top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000, help="synthetic pages (without --input)")
    parser.add_argument("--input", help="a folder of real pages instead of the synthetic corpus")
    parser.add_argument("--base_url", help="the build's --base_url (default: none; bases inferred)")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--work", default="/tmp/bench-profile")
    parser.add_argument("--save", help="also write the raw profile here (pstats format, for snakeviz etc.)")
    args = parser.parse_args(argv)
    source = args.input or corpus(args.work, args.pages)
    out = os.path.join(args.work, "index-profile")
    stats, wall, cpu = profile_build(source, out, args.base_url, args.shards)
    if args.save:
        stats.dump_stats(args.save)
    from ritrag.layout import IndexLayout

    counts = IndexLayout(out).load_manifest().stats
    print(f"Machine: {cpu_description()}. Command: `python -m benchmarks.build_profile "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}`.\n")
    print(report(stats, wall, cpu, counts["pages"]["pages_read"], counts["bm25"]["n_chunks"], args.top))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, force=True)
    main()
