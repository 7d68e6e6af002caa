"""Incremental update vs full build, in the same run, on real corpus pages.

    python -m benchmarks.update --corpus /path/to/build_corpus_output \
        [--products "flask sphinx apache-httpd"] [--changed 0.01] [--work /tmp/bench-update]

Builds an index of the chosen products (all of them when --products is empty),
then edits a deterministic `--changed` share of the pages (one sentence added to
their first paragraph), runs `update`, and reports both wall times, their ratio
(target: update <= 5% of the build), and how many chunks each run embedded.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from benchmarks.results import ProcessTreeMemory, cpu_description, write_section
from ritrag.pipelines import build, update
from ritrag.layout import IndexLayout

EDIT = b" This paragraph was revised for the update benchmark.</p>"


def copy_products(corpus: str, products: list[str], dest: str) -> int:
    shutil.rmtree(dest, ignore_errors=True)
    for product in products:
        shutil.copytree(os.path.join(corpus, product), os.path.join(dest, product))
    return sum(len(files) for _, _, files in os.walk(dest))


def edit_pages(directory: str, share: float) -> int:
    """Add a sentence to every (1/share)-th page in path order; returns pages edited."""
    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(directory) for f in files)
    step = max(1, round(1 / share))
    edited = 0
    for path in paths[::step]:
        with open(path, "rb") as fh:
            data = fh.read()
        if b"</p>" in data:
            data = data.replace(b"</p>", EDIT, 1)
        else:
            data = data.replace(b"</body>", b"<p>" + EDIT + b"</body>", 1)
        with open(path, "wb") as fh:
            fh.write(data)
        edited += 1
    return edited


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--products", default="flask sphinx apache-httpd")
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--work", default="/tmp/bench-update")
    args = parser.parse_args(argv)
    products = args.products.split() or sorted(
        d for d in os.listdir(args.corpus) if os.path.isdir(os.path.join(args.corpus, d)))

    snapshot_a, snapshot_b, index = (os.path.join(args.work, n) for n in ("a", "b", "index"))
    pages = copy_products(args.corpus, products, snapshot_a)
    shutil.rmtree(index, ignore_errors=True)
    common = ["--site_depth", "1"]
    with ProcessTreeMemory() as build_memory:
        started = time.perf_counter()
        build.run(["--input", snapshot_a, "--out", index, *common])
        build_s = time.perf_counter() - started
    shutil.rmtree(snapshot_b, ignore_errors=True)
    shutil.copytree(snapshot_a, snapshot_b)
    edited = edit_pages(snapshot_b, args.changed)
    with ProcessTreeMemory() as update_memory:
        started = time.perf_counter()
        update.run(["--input", snapshot_b, "--index", index])
        update_s = time.perf_counter() - started

    layout = IndexLayout(index)
    built = layout.load_manifest("v000001").stats["pages"]
    updated = layout.load_manifest().stats["pages"]
    body = f"""## Incremental update vs full build (benchmarks/update.py)

Machine: {cpu_description()}. Command: `python -m benchmarks.update {' '.join(argv or sys.argv[1:])}`.
Corpus: {pages} real pages of {', '.join(products)}; {edited} pages edited ({100 * edited / pages:.2f}%).

| run | wall s | chunks embedded | pages parsed | peak RSS |
|---|---|---|---|---|
| full build | {build_s:.1f} | {built.get('chunks_embedded', 0)} | {built.get('pages_parsed', 0)} | {build_memory.peak_total / 2**30:.2f} GiB |
| update | {update_s:.1f} | {updated.get('chunks_embedded', 0)} | {updated.get('pages_parsed', 0)} | {update_memory.peak_total / 2**30:.2f} GiB |

Update / build wall time: **{update_s / build_s:.3f}** (target <= 0.05). The update read
{updated.get('pages_read', 0)} pages, found {updated.get('pages_unchanged', 0)} unchanged, reused stored vectors
for {updated.get('chunks_reused_vectors', 0)} chunks and embedded {updated.get('chunks_embedded', 0)}.
"""
    print(body)
    write_section("benchmarks/update.py", "update", body)


if __name__ == "__main__":
    main()
