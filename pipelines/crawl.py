"""The crawl: seed URLs and sitemaps -> gzip WARC files + a CrawlDB, in rounds
(Nutch's generate -> fetch -> parse -> updatedb, one Beam job per round).

    python -m pipelines.crawl --seed URL [--seed URL ...] [--seeds FILE] --out CRAWL_DIR
        [--previous CRAWL_DIR] [--include REGEX] [--exclude REGEX] [--max_pages N] [--max_depth N]
        [--per_host_concurrency 2] [--per_host_delay_s 1.0] [--crawl_user_agent UA] [runner options]

Round 0 fetches the seeds (and, on a re-crawl, every page the previous CrawlDB
knows, conditionally); each host's first round also reads its robots.txt and
sitemaps. A round's job groups targets by host (politeness, see
transforms/crawl_round.py), stores kept bodies per shard in WARC files and
returns CrawlDB rows and discovered links; the launcher de-duplicates the links
(crawl_key) against everything scheduled so far and makes them the next round's
targets, until no new URL is in scope or --max_pages / --max_depth stop it. At
the end this crawl's rows replace the previous rows of the same URLs and
CRAWL_DIR/crawldb.parquet is replaced atomically.

CRAWL_DIR/
  crawldb.parquet                               ritrag.schema.CRAWLDB_SCHEMA
  warc/<crawl id>-rNN-sSSSSS-NNNNN.warc.gz      request + response records of kept bodies
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections import Counter
from datetime import datetime, timezone

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipelines.build import BuildOptions
from ritrag.schema import CRAWLDB_SCHEMA
from transforms.crawl_round import (LINKS, ROBOTS, CrawlConfig, FetchHostFn, Link, StoreShardFn, shard_key)
from transforms.crawldb import (CRAWLDB_FILE, WARC_DIR, CrawlTarget, crawldb_row, merge, read_crawldb,
                                revisit_targets)
from transforms.fetch import FetchPolicy
from transforms.robots import RobotsRules
from transforms.scope import BadUrl, Scope, clean_url, crawl_key, host_of
from transforms.tables import parquet_bytes, write_bytes

LOG = logging.getLogger("ritrag.crawl")
DEFAULT_USER_AGENT = "ritrag-crawl/0.1 (documentation indexer; set --crawl_user_agent to name yourself)"
ROUNDS_DIR = ".rounds"  # a round's rows, links and robots rules, until the crawl ends
VIA_RANK = {"sitemap": 0, "redirect": 1, "link": 2}  # which spelling of a URL wins when several arrive


class CrawlOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--seed", action="append", default=[], help="a seed URL (repeatable)")
        parser.add_argument("--seeds", default=None, help="file of seed URLs, one per line (# comments)")
        parser.add_argument("--previous", default=None,
                            help="CrawlDB directory of an earlier crawl to re-crawl conditionally "
                                 "(default: --out, when it holds one)")
        parser.add_argument("--include", action="append", default=[], help="regex: also in scope")
        parser.add_argument("--exclude", action="append", default=[], help="regex: never in scope")
        parser.add_argument("--max_pages", type=int, default=100_000, help="page URLs scheduled at most")
        parser.add_argument("--max_depth", type=int, default=20, help="link hops from a seed")
        parser.add_argument("--max_rounds", type=int, default=100)
        parser.add_argument("--per_host_concurrency", type=int, default=2)
        parser.add_argument("--per_host_delay_s", type=float, default=1.0)
        parser.add_argument("--max_crawl_delay_s", type=float, default=30.0,
                            help="a robots.txt Crawl-delay is honoured up to this")
        parser.add_argument("--crawl_user_agent", default=DEFAULT_USER_AGENT,
                            help="the User-Agent of every request and the robots.txt agent (Beam's --user_agent is another)")
        parser.add_argument("--timeout_s", type=float, default=20.0, help="for a whole response")
        parser.add_argument("--max_response_bytes", type=int, default=20 * 1024 * 1024,
                            help="decoded body size cap (also the decompression-bomb guard)")
        parser.add_argument("--retries", type=int, default=2, help="on 429, 5xx, timeouts, connection errors")
        parser.add_argument("--retry_backoff_s", type=float, default=1.0)
        parser.add_argument("--max_retry_after_s", type=float, default=120.0)
        parser.add_argument("--max_redirects", type=int, default=5)
        parser.add_argument("--warc_shards", type=int, default=4, help="WARC writers (files) per round")
        parser.add_argument("--warc_max_bytes", type=int, default=128 * 1024 * 1024,
                            help="a WARC file is closed once it reaches this size")


class CrawlJobOptions(CrawlOptions, BuildOptions):
    """Every flag the crawl reads (--out comes from BuildOptions)."""


def read_seeds(opts: CrawlJobOptions) -> tuple[list[str], list[dict]]:
    """(clean seed URLs, bad_url CrawlDB rows of the malformed ones)."""
    raw = list(opts.seed)
    if opts.seeds:
        with open(opts.seeds, encoding="utf-8") as fh:
            raw += [line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")]
    seeds, bad = [], []
    for text in raw:
        try:
            seeds.append(clean_url(text))
        except BadUrl as exc:
            LOG.error("bad seed: %s", exc)
            bad.append(crawldb_row(CrawlTarget(text), "bad_url", "", error=str(exc)))
    return seeds, bad


def crawl_config(opts: CrawlJobOptions, seeds: list[str]) -> CrawlConfig:
    policy = FetchPolicy(opts.crawl_user_agent, opts.timeout_s, opts.max_response_bytes, opts.retries,
                         opts.retry_backoff_s, opts.max_retry_after_s)
    return CrawlConfig(policy, Scope.for_seeds(seeds, opts.include, opts.exclude), opts.per_host_concurrency,
                       opts.per_host_delay_s, opts.max_crawl_delay_s, opts.max_depth, opts.max_redirects)


def round_pipeline(p: beam.Pipeline, targets: list[CrawlTarget], config: CrawlConfig,
                   robots: dict[str, RobotsRules], sitemap_hosts: frozenset[str], warc_dir: str,
                   file_prefix: str, crawl_id: str, opts: CrawlJobOptions, round_dir: str) -> None:
    """One round: fetch grouped by host -> store per shard. Its CrawlDB rows, links
    and robots rules go to files in `round_dir` for the launcher."""
    fetched = (p
               | "Targets" >> beam.Create(targets)
               | "KeyByHost" >> beam.Map(lambda t: (host_of(t.url), t))
               | "GroupByHost" >> beam.GroupByKey()
               | "FetchHost" >> beam.ParDo(FetchHostFn(config, robots, sitemap_hosts)).with_outputs(
                   LINKS, ROBOTS, main="outcomes"))
    (fetched["outcomes"]
     | "KeyByShard" >> beam.Map(shard_key, opts.warc_shards)
     | "GroupByShard" >> beam.GroupByKey()
     | "Store" >> beam.ParDo(StoreShardFn(warc_dir, file_prefix, crawl_id, opts.warc_max_bytes))
     | "RowsToList" >> beam.combiners.ToList()
     | "WriteRows" >> beam.Map(lambda rows: write_bytes(os.path.join(round_dir, "rows.parquet"),
                                                        parquet_bytes(rows, CRAWLDB_SCHEMA))))
    (fetched[LINKS]
     | "LinkJson" >> beam.Map(lambda l: json.dumps({"via": l.via, **dataclasses.asdict(l.target)}))
     | "LinksToList" >> beam.combiners.ToList()
     | "WriteLinks" >> beam.Map(lambda lines: write_bytes(os.path.join(round_dir, "links.jsonl"),
                                                          "\n".join(sorted(lines)).encode())))
    (fetched[ROBOTS]
     | "RobotsToList" >> beam.combiners.ToList()
     | "WriteRobots" >> beam.Map(lambda pairs: write_bytes(
         os.path.join(round_dir, "robots.json"),
         json.dumps({host: dataclasses.asdict(rules) for host, rules in pairs}).encode())))


def read_round(round_dir: str) -> tuple[list[dict], list[Link], dict[str, RobotsRules]]:
    rows = pq.read_table(os.path.join(round_dir, "rows.parquet")).to_pylist()
    with open(os.path.join(round_dir, "links.jsonl"), encoding="utf-8") as fh:
        links = [Link(CrawlTarget(**{k: v for k, v in d.items() if k != "via"}), d["via"])
                 for d in map(json.loads, filter(None, fh.read().split("\n")))]
    with open(os.path.join(round_dir, "robots.json"), encoding="utf-8") as fh:
        robots = {host: RobotsRules(**d) for host, d in json.load(fh).items()}
    return rows, links, robots


def next_targets(links: list[Link], scheduled: set[str], room: int) -> list[CrawlTarget]:
    """New URLs of a round's links, one spelling each (sitemap, then redirect, then
    link; then the shortest), at most `room`, in URL order."""
    best: dict[str, Link] = {}
    for link in links:
        key = crawl_key(link.target.url)
        if key in scheduled:
            continue
        rank = (VIA_RANK[link.via], link.target.depth, len(link.target.url), link.target.url)
        held = best.get(key)
        if held is None or rank < (VIA_RANK[held.via], held.target.depth, len(held.target.url), held.target.url):
            best[key] = link
    chosen = sorted(best.values(), key=lambda l: (l.target.depth, l.target.url))[:max(room, 0)]
    return sorted((l.target for l in chosen), key=lambda t: t.url)


def run(argv: list[str] | None = None) -> dict[str, int]:
    """Run a crawl; returns the count of CrawlDB rows of this crawl by kind and status."""
    options = PipelineOptions(argv)
    opts = options.view_as(CrawlJobOptions)
    if not opts.out:
        raise ValueError("missing required option: --out")
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = "FnApiRunner"
    seeds, bad_rows = read_seeds(opts)
    previous = read_crawldb(opts.previous or opts.out)
    if not seeds and not previous:
        raise ValueError("no valid seed URL (give --seed URL or --seeds FILE)" +
                         (f"; {len(bad_rows)} malformed" if bad_rows else ""))
    config = crawl_config(opts, seeds or sorted({r["url"] for r in previous if r["kind"] == "page"}))
    crawl_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    warc_dir = os.path.join(opts.out, WARC_DIR)
    os.makedirs(warc_dir, exist_ok=True)

    revisits = revisit_targets(previous)
    known = {crawl_key(t.url) for t in revisits}
    targets = revisits + [CrawlTarget(s) for s in dict.fromkeys(seeds) if crawl_key(s) not in known]
    targets = sorted(targets, key=lambda t: t.url)[: opts.max_pages]
    scheduled = {crawl_key(t.url) for t in targets}
    robots: dict[str, RobotsRules] = {}
    sitemap_done: set[str] = set()
    rows: list[dict] = list(bad_rows)
    started = time.time()
    LOG.info("crawl %s: %d seeds, %d known pages to re-visit, scope %s", crawl_id, len(seeds), len(revisits),
             ", ".join(config.scope.prefixes))
    for number in range(opts.max_rounds):
        if not targets:
            break
        hosts = {host_of(t.url) for t in targets}
        round_dir = os.path.join(opts.out, ROUNDS_DIR, f"{crawl_id}-r{number:02d}")
        os.makedirs(round_dir, exist_ok=True)
        with beam.Pipeline(options=options) as p:
            round_pipeline(p, targets, config, dict(robots), frozenset(hosts - sitemap_done), warc_dir,
                           f"{crawl_id}-r{number:02d}", crawl_id, opts, round_dir)
        round_rows, links, round_robots = read_round(round_dir)
        sitemap_done |= hosts
        robots.update(round_robots)
        check_round(targets, round_rows, number)
        rows += round_rows
        targets = next_targets(links, scheduled, opts.max_pages - len(scheduled))
        scheduled |= {crawl_key(t.url) for t in targets}
        LOG.info("round %d: %d rows, %d new URLs for the next round, %d scheduled, %.0f s", number,
                 len(round_rows), len(targets), len(scheduled), time.time() - started)
    counts = Counter(f"{r['kind']}_{r['status']}" for r in rows)
    write_crawldb(opts.out, merge(previous, rows))
    shutil.rmtree(os.path.join(opts.out, ROUNDS_DIR), ignore_errors=True)
    pages = sum(n for k, n in counts.items() if k.startswith("page_"))
    LOG.info("crawl accounting: %d page URLs scheduled = %s; %s; %.1f s (%.1f pages/s)",
             pages - len(bad_rows), " + ".join(f"{k[5:]} {n}" for k, n in sorted(counts.items())
                                              if k.startswith("page_") and k != "page_bad_url"),
             ", ".join(f"{k} {n}" for k, n in sorted(counts.items()) if not k.startswith("page_")
                       or k == "page_bad_url"),
             time.time() - started, pages / max(time.time() - started, 1e-9))
    return dict(counts)


def check_round(targets: list[CrawlTarget], rows: list[dict], number: int) -> None:
    """Every target of a round ends as exactly one page row."""
    wanted = Counter(t.url for t in targets)
    got = Counter(r["url"] for r in rows if r["kind"] == "page")
    if wanted != got:
        missing, extra = wanted - got, got - wanted
        raise RuntimeError(f"round {number}: crawl accounting mismatch: {sum(missing.values())} targets "
                           f"without a row (e.g. {list(missing)[:3]}), {sum(extra.values())} rows without "
                           f"a target (e.g. {list(extra)[:3]}); CrawlDB not written")


def write_crawldb(crawl_dir: str, rows: list[dict]) -> None:
    path = os.path.join(crawl_dir, CRAWLDB_FILE)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(parquet_bytes(rows, CRAWLDB_SCHEMA))
    os.replace(tmp, path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()
