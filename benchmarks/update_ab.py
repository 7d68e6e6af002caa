"""A one-page `ritrag update`, baseline code against this checkout's, in the same run.

    python -m benchmarks.update_ab BASE_INDEX INPUT --baseline_path DIR [--rounds 2] [--work DIR]

BASE_INDEX is an index built from INPUT (e.g. `ritrag synth --pages 100000` then
`ritrag build --embedding_model hashing:384`), INPUT the folder with the change
to pick up (edit a page first). DIR holds the baseline's ritrag (`pip install
--no-deps --target DIR WHEEL` of an older commit), put first on PYTHONPATH; the
current code is the ritrag this Python imports. Each run updates a fresh
copy of BASE_INDEX, its segment files hard-linked (so every run starts from
the same version), the two
codes alternating which goes first in a round; prints each run's wall seconds,
load average and the files trusted by their stamp, then the medians and their
ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def one_update(base: str, pages: str, copy: str, env: dict[str, str]) -> tuple[float, dict]:
    """Wall seconds of `ritrag update pages` on a fresh copy of `base`, and its page counts."""
    shutil.rmtree(copy, ignore_errors=True)
    # Segment files hard-linked (a job never writes into a published one: it
    # adds a segment and replaces CURRENT), the rest copied: seconds, no disk.
    os.makedirs(copy)
    for name in os.listdir(base):
        subprocess.run(["cp", "-al" if name == "segments" else "-a", os.path.join(base, name), copy], check=True)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "from ritrag.cli import main; main()", "update", pages,
                           "--index", copy], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    with open(os.path.join(copy, "CURRENT")) as fh:
        version = fh.read().strip()
    with open(os.path.join(copy, "versions", version + ".json")) as fh:
        pages_counts = json.load(fh)["stats"]["pages"]
    shutil.rmtree(copy)
    return wall, pages_counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base_index", help="an index built from INPUT")
    ap.add_argument("input", help="the input folder, with the change to pick up")
    ap.add_argument("--baseline_path", required=True, help="folder holding the baseline's ritrag (PYTHONPATH)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each code")
    ap.add_argument("--work", default=tempfile.gettempdir(), help="where the copies of the base are made")
    args = ap.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    codes = {"baseline": {**env, "PYTHONPATH": os.pathsep.join(filter(None, [args.baseline_path,
                                                                            env.get("PYTHONPATH")]))},
             "current": env}
    walls: dict[str, list[float]] = {name: [] for name in codes}
    for r in range(args.rounds):
        for name in (list(codes) if r % 2 == 0 else list(codes)[::-1]):
            load = os.getloadavg()[0]
            wall, pages = one_update(args.base_index, args.input, os.path.join(args.work, f"update-ab-{name}"),
                                     codes[name])
            walls[name].append(wall)
            print(f"round {r} {name}: {wall:.1f} s (load {load:.1f}), trusted by stamp "
                  f"{pages.get('pages_trusted_by_stamp')} of {pages.get('pages_read')}, indexed "
                  f"{pages.get('pages_indexed')}", flush=True)
    medians = {name: statistics.median(runs) for name, runs in walls.items()}
    for name, median in medians.items():
        print(f"{name}: median {median:.1f} s ({', '.join(f'{w:.1f}' for w in walls[name])})")
    print(f"baseline/current: {medians['baseline'] / medians['current']:.2f}x")


if __name__ == "__main__":
    main()
