"""Where the build's CPU goes: one in-process build, sampled on the process's
CPU clock, its CPU time by Beam stage and by function.

    python -m benchmarks.build_profile --pages 5000 [--work DIR] [--top 25]
    python -m benchmarks.build_profile --input /work/corpus-subset [--base_url URL]

Without --input the corpus is `ritrag synth`'s (cached under --work). The build
is `ritrag.pipelines.build.run` with the `hashing:384` stand-in for the model, on
Beam's in-process FnApiRunner, whose bundles run in the calling thread, so one
stack shows which DoFn runs. Without --base_url the sites' bases are inferred
(the head pass runs), as for a mirror.

Stages are the DoFns (and the functions the Beam steps of pipelines/build.py
call) named in STAGES, each charged the CPU time sampled while one of its entry
functions was on the stack. "of which" rows are parts of the row above. What
no stage claims is Beam's own work (the runner, coders, shuffles in memory,
progress), reading matched files and the launcher. A sampler on the CPU clock
(`CpuSampler`) rather than cProfile: cProfile's per-call cost inflates Python
code against C code, and its wall clock counts other jobs' turns on a shared
machine; the samples add up to the process's CPU time.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import logging
import os
import re
import shutil
import signal
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
    Stage("forest placement (PlaceSite)", (P + "nodes:PlaceSiteFn.process",)),
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
    Stage("dense: train (Dense)", (P + "dense:train_dense_index",)),
)


def code_key(function: Function) -> tuple[str, int, str] | None:
    """The key (file, first line, name) of `function`'s code, None if the code profiled lacks it."""
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


Stack = tuple[tuple[str, int, str], ...]  # code keys, innermost first


class CpuSampler:
    """A sampling profiler on the process's CPU clock: SIGPROF every `interval_s`
    of CPU time (every thread's: the tokenizer's own threads count), and the CPU
    time since the previous sample charged to the main thread's Python stack
    when the signal is handled. Python handles a signal after the C call it
    interrupted returns, so a long C call's time lands on the function that
    made it, whole (signals that arrive meanwhile merge, the clock does not)."""

    def __init__(self, interval_s: float = 0.002):
        self._interval_s = interval_s
        self.stacks: collections.Counter[Stack] = collections.Counter()

    def __enter__(self) -> "CpuSampler":
        self._previous = signal.signal(signal.SIGPROF, self._sample)
        self._last = time.process_time()
        signal.setitimer(signal.ITIMER_PROF, self._interval_s, self._interval_s)
        return self

    def __exit__(self, *exc) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, self._previous)

    def _sample(self, _signum, frame) -> None:
        now = time.process_time()
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append((code.co_filename, code.co_firstlineno, code.co_name))
            frame = frame.f_back
        self.stacks[tuple(stack)] += now - self._last
        self._last = now

    @property
    def total_s(self) -> float:
        return sum(self.stacks.values())

    def inclusive(self, functions: tuple[Function, ...]) -> float:
        """CPU seconds with one of `functions` on the stack."""
        keys = {code_key(f) for f in functions} - {None}
        return sum(t for stack, t in self.stacks.items() if keys.intersection(stack))

    def own(self, top: int) -> list[tuple[str, float]]:
        """The `top` innermost Python functions by CPU seconds (a C call's time is its caller's)."""
        own: collections.Counter = collections.Counter()
        for stack, t in self.stacks.items():
            own[stack[0]] += t
        return [(f"{short_path(file)}:{line} {name}", t) for (file, line, name), t in own.most_common(top)]


def stage_rows(sampler: CpuSampler) -> list[tuple[str, float, bool]]:
    """(label, CPU seconds, is a part) per stage, then what no stage claims."""
    rows = [(s.label, sampler.inclusive(s.entries), s.part_of is not None) for s in STAGES]
    claimed = sum(t for _, t, part in rows if not part)
    return rows + [("Beam runner, reading, launcher (the rest)", sampler.total_s - claimed, False)]


def short_path(path: str) -> str:
    """A profiled file as its package-relative path."""
    return re.split(r"site-packages/|/ritrag/|/lib/python3\.\d+/", path, maxsplit=1)[-1]


def profile_build(input_dir: str, out: str, base_url: str | None, shards: int) -> tuple[CpuSampler, float, float]:
    """(samples, wall seconds, process CPU seconds) of one build."""
    shutil.rmtree(out, ignore_errors=True)
    argv = ["--input", input_dir, "--out", out, "--site_depth", "1", "--embedding_model", "hashing:384",
            "--num_shards", str(shards), "--keep_versions", "1"]
    if base_url:
        argv += ["--base_url", base_url]
    started, cpu_before = time.perf_counter(), time.process_time()
    with CpuSampler() as sampler:
        build.run(argv)
    return sampler, time.perf_counter() - started, time.process_time() - cpu_before


def report(sampler: CpuSampler, wall: float, cpu: float, pages: int, chunks: int, top: int) -> str:
    total = sampler.total_s
    lines = [f"{pages:,} pages, {chunks:,} chunks; {cpu:.1f} s process CPU ({total:.1f} s sampled), "
             f"{wall:.1f} s wall", "",
             "| stage | CPU s | share | CPU ms per page |", "|---|---|---|---|"]
    for label, seconds, part in stage_rows(sampler):
        name = f"&nbsp;&nbsp;of which {label}" if part else label
        lines.append(f"| {name} | {seconds:.1f} | {seconds / total:.1%} | {1000 * seconds / pages:.2f} |")
    lines += ["", f"Hot functions (CPU of the innermost Python function, a C call's charged to its caller; "
              f"top {top}):", "", "| function | CPU s | share |", "|---|---|---|"]
    lines += [f"| {name} | {seconds:.2f} | {seconds / total:.1%} |" for name, seconds in sampler.own(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000, help="synthetic pages (without --input)")
    parser.add_argument("--input", help="a folder of real pages instead of the synthetic corpus")
    parser.add_argument("--base_url", help="the build's --base_url (default: none; bases inferred)")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--work", default="/tmp/bench-profile")
    parser.add_argument("--save", help="also write the samples here as collapsed stacks (flamegraph.pl, speedscope)")
    args = parser.parse_args(argv)
    source = args.input or corpus(args.work, args.pages)
    out = os.path.join(args.work, "index-profile")
    sampler, wall, cpu = profile_build(source, out, args.base_url, args.shards)
    if args.save:
        with open(args.save, "w", encoding="utf-8") as fh:
            for stack, seconds in sampler.stacks.items():
                fh.write(";".join(f"{name} ({short_path(file)}:{line})" for file, line, name in reversed(stack))
                         + f" {round(seconds * 1e6)}\n")
    from ritrag.layout import IndexLayout

    counts = IndexLayout(out).load_manifest().stats
    print(f"Machine: {cpu_description()}. Command: `python -m benchmarks.build_profile "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}`.\n")
    print(report(sampler, wall, cpu, counts["pages"]["pages_read"], counts["bm25"]["n_chunks"], args.top))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, force=True)
    main()
