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
wall time, inflated by the profiler's per-call overhead, so the shares, not
the seconds, are the figures to compare, on an idle machine: the process CPU
time of the same run is printed beside it (well below the profiled time: other
work took turns on the CPUs).
"""
from __future__ import annotations

import argparse
import cProfile
import importlib
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

Function = str  # "module:qualified name" of a function of the build, resolved in the code profiled


class Stage(NamedTuple):
    label: str
    entries: tuple[Function, ...]
    part_of: str | None = None  # a row it is a part of


# The build's steps (pipelines/build.py) by the functions they run; a function
# the code profiled lacks (an older build) counts nothing.
P = "ritrag.transforms."
STAGES = (
    Stage("site bases: head pass (InferSiteBases)", (P + "site_base:_NamedBasesFn.process",)),
    Stage("declared URLs of the head", (P + "parse.declared:declared_page_urls",),
          "site bases: head pass (InferSiteBases)"),
    Stage("parse (ParsePages)", (P + "pages:ParsePagesFn.process",)),
    Stage("skeletons, page sources (Forest)", ("ritrag.schema:PageSkeleton.of", "ritrag.schema:PageSource.of")),
    Stage("spill parsed pages (SpillPages)", (P + "pages:SpillPagesFn.process", P + "pages:SpillPagesFn.finish_bundle")),
    Stage("forest placement (PlaceSite)", (P + "nodes:place_site",)),
    Stage("node rows (NodeRows)", (P + "nodes:NodeRowsFn.process",)),
    Stage("re-read + second parse", (P + "pages:reread_page",), "node rows (NodeRows)"),
    Stage("read back from the spill", (P + "pages:read_spilled_page",), "node rows (NodeRows)"),
    Stage("chunk (Chunk)", (P + "chunk:ChunkNodesFn.process",)),
    Stage("token counts", (P + "chunk:tokenizer_counter.<locals>.count", P + "chunk:word_counter.<locals>.count_words"),
          "chunk (Chunk)"),
    Stage("the tokenizer itself", (P + "chunk:tokenizer_counter.<locals>.count",), "chunk (Chunk)"),
    Stage("representation (path, render, node doc)",
          ("ritrag.representation:Representation.render", "ritrag.representation:Representation.node_doc"),
          "chunk (Chunk)"),
    Stage("chunk ids, text hashes", ("ritrag.ids:chunk_id_for", "ritrag.ids:content_hash"), "chunk (Chunk)"),
    Stage("sparse: analyze, df (Sparse)",
          (P + "sparse:chunk_terms", P + "sparse:_CountTermsFn.process", P + "sparse:_CountTermsFn.finish_bundle")),
    Stage("analyzer", ("ritrag.analyzer:analyze",), "sparse: analyze, df (Sparse)"),
    Stage("tables: spill, sort, write (WriteShards)",
          (P + "tables:_SpillByShardFn.process", P + "tables:_SpillByShardFn.finish_bundle",
           P + "tables:_WriteShardFn.process", P + "tables:write_bytes")),
    Stage("postings tables", (P + "sparse:postings_table", P + "sparse:write_postings_file"),
          "tables: spill, sort, write (WriteShards)"),
    Stage("dense shards, vector files", (P + "dense:write_dense_shard",), "tables: spill, sort, write (WriteShards)"),
    Stage("embed: hashing stand-in (Embed)", (P + "embed:SentenceTransformerModelHandler.run_inference",)),
    Stage("dense: train (Dense)", (P + "dense:_train",)),
)


def code_key(function: Function) -> tuple[str, int, str] | None:
    """cProfile's key (file, first line, name) of `function`, None if the code profiled lacks it."""
    module, _, qualname = function.partition(":")
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return None
    if ".<locals>." in qualname:  # a closure: its code is a constant of the function making it
        outer_name, inner = qualname.split(".<locals>.")
        outer = getattr(obj, outer_name, None)
        codes = [c for c in (outer.__code__.co_consts if outer else ()) if getattr(c, "co_name", "") == inner]
        code = codes[0] if codes else None
    else:
        for name in qualname.split("."):
            obj = getattr(obj, name, None)
        code = getattr(obj, "__code__", None)
    return (code.co_filename, code.co_firstlineno, code.co_name) if code else None


def inclusive(stats: pstats.Stats, functions: tuple[Function, ...]) -> float:
    """Inclusive seconds of `functions` (each with all it calls), the time of
    one of them called by another counted once."""
    keys = {code_key(f) for f in functions} & set(stats.stats)
    total = sum(stats.stats[key][3] for key in keys)
    nested = sum(edge[3] for key in keys for caller, edge in stats.stats[key][4].items() if caller in keys)
    return total - nested


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
    # The default clock (wall time of the one thread every bundle runs in): a
    # CPU clock is a system call, which would inflate each Python call's share.
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
