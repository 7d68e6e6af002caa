"""Parse + forest + chunk throughput per core, against a plain lxml pass, same run.

    python -m benchmarks.parse --corpus /path/to/build_corpus_output [--per_product 50] [--repeats 3]

A sample of pages per product (seeded) is processed the way a build worker does
it, without Beam: `parse_page`, then `build_site_forest` per site, then the
chunks of every page node with the embedding model's tokenizer. The baseline is
`lxml.html.fromstring(data).text_content()` over the same bytes. Both are timed
on one core, best of `--repeats`, in CPU seconds (robust on a shared machine)
and wall seconds. Target: at least 40% of the baseline's pages/s.

Feeding the embedder: chunks/s per core of the CPU stages (CPU time, not wall
time: the machine is shared), next to the embedder's chunks/s on CPU (measured
by benchmarks/embed.py, passed in) and a projection of its rate on one GPU
from FLOPs (2 x non-embedding parameters + attention, per token, at the
measured mean tokens per chunk; an assumed utilization of the GPU's dense
16-bit peak). A build worker parses each page twice (skeleton pass, node-rows
pass) and, without --base_url, reads its head once more: the "as the build runs
them" rate counts that. Cores per GPU worker = the GPU's projected chunks/s
over that per-core rate.
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
from ritrag.urls import site_of
from ritrag.schema import PageSkeleton
from ritrag.transforms.chunk import chunk_rows, counts_add_up, tokenizer_counter
from ritrag.transforms.forest import build_site_forest
from ritrag.transforms.parse import UnparseablePage, declared_page_urls, parse_page

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


def heads(pages: list[tuple[str, bytes]]) -> None:
    for _, data in pages:
        declared_page_urls(data)


# all-MiniLM-L6-v2 (the bundled model): 6 layers, hidden 384, feed-forward 1536.
_LAYERS, _HIDDEN, _FFN = 6, 384, 1536


def flops_per_token(tokens_per_chunk: float) -> float:
    """Forward FLOPs per token: 2 x the non-embedding weights, plus the attention
    scores and weighted sum (4 x sequence x hidden per layer)."""
    weights = _LAYERS * (4 * _HIDDEN * _HIDDEN + 2 * _HIDDEN * _FFN)
    return 2 * weights + 4 * _LAYERS * tokens_per_chunk * _HIDDEN


def pipeline_stages(pages: list[tuple[str, bytes]], count, limit: int, additive: bool, upto: str = "chunk",
                    token_counts: list[int] | None = None) -> int:
    """parse -> forest per site -> chunks of every page, stopping after stage
    `upto`; returns chunks made (their token counts appended to `token_counts`)."""
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
                rows = chunk_rows(placement.node_id, placement.node_id, page.title, page.body, count, limit, additive)
                chunks += len(rows)
                if token_counts is not None:
                    token_counts.extend(row.n_tokens for row in rows)
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
    parser.add_argument("--embed_cpu_chunks_per_s", type=float, required=True,
                        help="the embed step's chunks/s on CPU, from benchmarks/embed.py's table")
    parser.add_argument("--embed_cpu_cores", type=int, required=True, help="the cores that rate used")
    parser.add_argument("--gpu", default="L4:121,H100 SXM:989",
                        help="NAME:dense 16-bit peak TFLOP/s, comma-separated, for the projection")
    parser.add_argument("--gpu_utilization", type=float, default=0.3,
                        help="assumed fraction of the GPU's peak the embed step reaches")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    pages = sample_pages(args.corpus, args.per_product, args.seed)
    spec = EmbedderSpec()
    tokenizer = load_tokenizer(spec)
    count, limit = tokenizer_counter(tokenizer), model_token_limit(spec, tokenizer)
    additive = counts_add_up(tokenizer)
    token_counts: list[int] = []
    chunks = pipeline_stages(pages, count, limit, additive, token_counts=token_counts)
    tokens_per_chunk = sum(token_counts) / len(token_counts)
    heads_cpu, _ = best_of(lambda: heads(pages), args.repeats)
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

{feed_table(args, chunks, tokens_per_chunk, ours_cpu, stages["parse"][0], heads_cpu)}
"""
    print(body)
    write_section("benchmarks/parse.py", "parse", body)


def feed_table(args, chunks: int, tokens_per_chunk: float, chunk_cpu: float, parse_cpu: float,
               heads_cpu: float) -> str:
    """Whether the CPU stages feed the embedder: their chunks/s per core next to
    the embedder's, and the cores one GPU worker needs."""
    stages_rate = chunks / chunk_cpu
    build_rate = chunks / (chunk_cpu + parse_cpu + heads_cpu)  # second parse, head pass
    cpu_embed = args.embed_cpu_chunks_per_s / args.embed_cpu_cores
    per_chunk = flops_per_token(tokens_per_chunk) * tokens_per_chunk
    lines = [
        "### Feeding the embedder (chunks/s per core, CPU time)",
        "",
        f"{chunks} chunks, mean {tokens_per_chunk:.0f} model tokens each; forward pass "
        f"{per_chunk / 1e9:.1f} GFLOP per chunk (all-MiniLM-L6-v2).",
        "",
        "| | chunks/s |",
        "|---|---|",
        f"| CPU stages: parse + forest + chunk, per core | {stages_rate:,.0f} |",
        f"| CPU stages as the build runs them (parse twice, head pass), per core | {build_rate:,.0f} |",
        f"| embedder on CPU, per core (benchmarks/embed.py: {args.embed_cpu_chunks_per_s} on "
        f"{args.embed_cpu_cores} cores) | {cpu_embed:,.1f} |",
    ]
    for spec in args.gpu.split(","):
        name, tflops = spec.rsplit(":", 1)
        rate = args.gpu_utilization * float(tflops) * 1e12 / per_chunk
        lines.append(f"| embedder on one {name}, **projected** ({args.gpu_utilization:.0%} of {tflops} "
                     f"TFLOP/s; not measured) | {rate:,.0f}; needs {rate / build_rate:.1f} cores per GPU |")
    lines += ["", f"On CPU the embedder is {stages_rate / cpu_embed:,.0f}x slower per core than the CPU stages: "
              "embedding dominates. Cores per GPU worker so that the GPU never waits = projected GPU chunks/s "
              "/ CPU-stage chunks/s per core (as the build runs them)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
