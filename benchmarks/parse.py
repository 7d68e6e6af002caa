"""Parse + forest + chunk throughput per core, against a plain lxml pass, same run.

    python -m benchmarks.parse --corpus /path/to/build_corpus_output [--per_product 50] [--repeats 3]

A sample of pages per product (seeded) is processed the way a build worker does
it, without Beam: `parse_page`, then `build_site_forest` per site, then the
chunks of every page node with the embedding model's tokenizer. The baseline is
`lxml.html.fromstring(data).text_content()` over the same bytes. Both are timed
on one core, best of `--repeats`, in CPU seconds (robust on a shared machine)
and wall seconds. Target: at least 40% of the baseline's pages/s.
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import random
import sys
import time

import lxml.html

from benchmarks.results import cpu_description, write_section
from ritrag.embedder import EmbedderSpec, load_tokenizer, model_token_limit
from ritrag.ids import site_of
from ritrag.schema import PageSkeleton
from transforms.chunk import chunk_rows, counts_add_up, tokenizer_counter
from transforms.forest import build_site_forest
from transforms.parse import UnparseablePage, parse_page

BASE = "http://localhost/"


def sample_pages(corpus: str, per_product: int, seed: int) -> list[tuple[str, bytes]]:
    with open(os.path.join(corpus, "manifest.tsv"), encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    by_product = collections.defaultdict(list)
    for row in rows:
        by_product[row["product"]].append(row["relative_path"])
    rnd = random.Random(seed)
    chosen = []
    for product in sorted(by_product):
        for rel in rnd.sample(by_product[product], min(per_product, len(by_product[product]))):
            with open(os.path.join(corpus, product, rel), "rb") as fh:
                chosen.append((f"{BASE}{product}/{rel}", fh.read()))
    return chosen


def baseline(pages: list[tuple[str, bytes]]) -> None:
    for _, data in pages:
        lxml.html.fromstring(data).text_content()


def pipeline_stages(pages: list[tuple[str, bytes]], count, limit: int, additive: bool, upto: str = "chunk") -> int:
    """parse -> forest per site -> chunks of every page, stopping after stage
    `upto`; returns chunks made."""
    parsed, skeletons = {}, collections.defaultdict(list)
    for url, data in pages:
        try:
            page = parse_page(data, url, site_of(url, 1))
        except UnparseablePage:
            continue
        parsed[page.url] = page
        skeletons[page.site].append(PageSkeleton.of(page))
    chunks = 0
    if upto == "parse":
        return chunks
    for site, skeleton in skeletons.items():
        placements = build_site_forest(site, skeleton).placements
        if upto == "forest":
            continue
        for placement in placements:
            page = parsed.get(placement.url) if placement.kind == "page" else None
            if page is not None:
                chunks += len(chunk_rows(placement.node_id, placement.node_id, page.title, page.body, count, limit,
                                             additive))
    return chunks


def best_of(fn, repeats: int) -> tuple[float, float]:
    """(best CPU seconds, best wall seconds) of `fn()` over `repeats` runs."""
    cpu, wall = float("inf"), float("inf")
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - w0)
    return cpu, wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--per_product", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    pages = sample_pages(args.corpus, args.per_product, args.seed)
    spec = EmbedderSpec()
    tokenizer = load_tokenizer(spec)
    count, limit = tokenizer_counter(tokenizer), model_token_limit(spec, tokenizer)
    additive = counts_add_up(tokenizer)
    chunks = pipeline_stages(pages, count, limit, additive)
    base_cpu, base_wall = best_of(lambda: baseline(pages), args.repeats)
    stages = {upto: best_of(lambda: pipeline_stages(pages, count, limit, additive, upto), args.repeats)
              for upto in ("parse", "forest", "chunk")}
    ours_cpu, ours_wall = stages["chunk"]
    n, megabytes = len(pages), sum(len(d) for _, d in pages) / 1e6
    rows = "\n".join(f"| ritrag up to {upto}: {label} | {n / c:.0f} | {n / w:.0f} | {base_cpu / c:.2f} |"
                     for (upto, (c, w)), label in zip(stages.items(), (
                         "parse_page", "parse_page + build_site_forest",
                         "parse_page + build_site_forest + chunk_rows (tokenizer)")))
    body = f"""## Parse + forest + chunk throughput (benchmarks/parse.py)

Machine: {cpu_description()}. Command: `python -m benchmarks.parse {' '.join(argv or sys.argv[1:])}`.
Pages: {n} ({megabytes:.1f} MB), {args.per_product} per product of the build_corpus.sh corpus (seed {args.seed});
{chunks} chunks. One core, best of {args.repeats}.

| | pages/s (CPU time) | pages/s (wall) | ratio to baseline (CPU) |
|---|---|---|---|
| baseline: `lxml.html.fromstring(data).text_content()` | {n / base_cpu:.0f} | {n / base_wall:.0f} | 1.00 |
{rows}

Target: parse + forest + chunk at >= 0.40 of the baseline; measured **{base_cpu / ours_cpu:.2f}**.
"""
    print(body)
    write_section("benchmarks/parse.py", "parse", body)


if __name__ == "__main__":
    main()
