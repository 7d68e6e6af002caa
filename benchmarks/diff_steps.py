"""The update's diff, step by step, per input file: each DoFn of
transforms/diff.py called directly on a folder against a built index (no
runner), so the cost of a step per file shows without Beam's.

    python -m benchmarks.diff_steps INPUT_FOLDER INDEX [--rounds 3]

INPUT_FOLDER is what `ritrag update INPUT_FOLDER --index INDEX` would read (the
index built from it, e.g. by `ritrag synth` + `ritrag build`). Prints, for the
listing, the locating (the URL each path names and its pages shard), the stamp
match and the shard classification, the median seconds over the rounds and the
microseconds per file. To compare two commits, run it with each one's ritrag
importable (a wheel's folder on PYTHONPATH) on the same folder and index.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from ritrag.reader import IndexReader
from ritrag.transforms import diff
from ritrag.transforms.pages import PageParser, input_root_and_pattern


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="the input folder an update would read")
    ap.add_argument("index", help="the index built from it")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every step (the median is printed)")
    args = ap.parse_args(argv)
    live = IndexReader(args.index)
    config = live.manifest.settings.index
    root, pattern = input_root_and_pattern(args.input)
    parser = PageParser(root=root, base_url=config.page_base_url, site_depth=config.site_depth
                        ).with_site_bases(live.manifest.settings.site_bases)
    seconds: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):
        start = time.perf_counter()
        batches = list(diff.ListFileBatchesFn().process(pattern))
        seconds["list the input"].append(time.perf_counter() - start)
        files = sum(len(batch) for batch in batches)
        start = time.perf_counter()
        locate, located = diff.LocateInputBatchFn(parser, config.num_shards), defaultdict(list)
        for batch in batches:
            for shard, items in locate.process(batch):
                located[shard].append(items)
        seconds["locate (URL, shard)"].append(time.perf_counter() - start)
        start = time.perf_counter()
        match, trusted, to_read = diff.MatchStampsFn(live), defaultdict(list), 0
        for shard, shard_batches in located.items():
            for out in match.process((shard, shard_batches)):
                if isinstance(out, tuple):
                    trusted[out[0]].append(out[1])
                else:
                    to_read += len(out.value)
        seconds["match stamps"].append(time.perf_counter() - start)
        start = time.perf_counter()
        classify = diff.ClassifyShardFn(live)
        for shard in range(config.num_shards):
            for _ in classify.process((shard, trusted.get(shard, []) + [[]])):
                pass
        seconds["classify the shards"].append(time.perf_counter() - start)
    print(f"{files:,} files, {to_read:,} to read and hash (not timed)")
    for step, runs in seconds.items():
        median = statistics.median(runs)
        print(f"  {step:22s} {median:6.2f} s  {median / max(files, 1) * 1e6:6.1f} us/file  "
              f"(runs: {', '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    main()
