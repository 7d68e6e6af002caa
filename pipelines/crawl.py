"""The crawl: seed URLs and sitemaps -> gzip WARC files + a CrawlDB, in rounds
(Nutch's generate -> fetch -> parse -> updatedb, one Beam job per round).

    python -m ritrag.pipelines.crawl --seed URL [--seed URL ...] [--seeds FILE] --out CRAWL_DIR
        [--previous CRAWL_DIR] [--include REGEX] [--exclude REGEX] [--max_pages N] [--max_depth N]
        [--per_host_concurrency 2] [--per_host_delay_s 1.0] [--crawl_user_agent UA] [runner options]

Round 0 fetches the seeds (and, on a re-crawl, every page the previous CrawlDB
knows, conditionally); each host's first round also reads its robots.txt and
sitemaps. A round's job: [round 0: generate the fetch list from seeds and the
previous CrawlDB] -> group targets by host and fetch (politeness, see
transforms/crawl/round.py) -> store kept bodies per shard in WARC files and the
round's CrawlDB rows in Parquet -> generate the next round's fetch list from the
links found, de-duplicated against every URL scheduled so far
(transforms.crawl.crawldb.Generate). Rounds continue until no new URL is in scope or
--max_pages / --max_depth / --max_rounds stop them. A last job
(transforms.crawl.crawldb.UpdateCrawlDb) merges this crawl's rows over the previous
CrawlDB and CRAWL_DIR/crawldb.parquet is replaced atomically.

The launcher holds no URL lists: rows, links and fetch lists pass between jobs
as Parquet files, and the launcher keeps only counts, the robots rules of the
hosts met (O(hosts)) and, for the last job, the redirect map (O(redirect rows)).

CRAWL_DIR/
  crawldb.parquet                               ritrag.schema.CRAWLDB_SCHEMA
  warc/<crawl id>-rNN-sSSSSS-NNNNN.warc.gz      request + response records of kept bodies
  LEASE                                         held while a crawl runs (ritrag.lease.IndexLease)
  .rounds/<crawl id>/rNN/                       targets-*, rows-*, robots.json, mismatches-*, counts.json;
                                                deleted at the end
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import Counter
from datetime import datetime, timezone

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from ritrag.pipelines.launcher import BuildOptions, PublishOptions, job_options
from ritrag.pipelines.options import JobFlags
from ritrag.flags import add_arguments, from_arguments, option
from ritrag.layout import IndexLayout
from ritrag.storage import (dir_exists, exists, make_dirs, match_files, open_parquet, open_read, remove_tree, replace_file)
from ritrag.crawl_dir import WARC_DIR, crawldb_path, scan_crawldb
from ritrag.lease import IndexLease
from ritrag.schema import CRAWL_TARGET_SCHEMA, CRAWLDB_SCHEMA, RESTING_SCHEMA
from ritrag.transforms.counts import COUNTS, WriteCounts, read_counts, record_counts
from ritrag.transforms.progress import LogProgress
from ritrag.transforms.crawl.round import LINKS, ROBOTS, CrawlConfig, FetchHostFn, StoreShardFn, shard_key
from ritrag.transforms.crawl.crawldb import (CrawlTarget, Generate, UpdateCrawlDb, crawldb_row, record_target,
                                             RESTING, redirect_hops, revisit_record, target_record)
from ritrag.transforms.crawl.downloader import FetchPolicy
from ritrag.transforms.crawl.robots import RobotsRules
from ritrag.transforms.crawl.scope import BadUrl, Scope, clean_url, crawl_key
from ritrag.transforms.tables import write_bytes
from ritrag.urls import origin_of

LOG = logging.getLogger("ritrag.crawl")
# Beam warns of a `skip_if_empty` write that had nothing to write: a round's accounting
# mismatches, whose empty outcome is the good one (it was printed on every round).
logging.getLogger("apache_beam.io.filebasedsink").addFilter(
    lambda record: "No shards found to finalize" not in str(record.msg))
ROUNDS_DIR = ".rounds"  # a crawl's working files (fetch lists, rows, robots rules) until it ends


@dataclasses.dataclass(frozen=True)
class CrawlJob:
    """What one crawl job is asked, beyond how it crawls and fetches (CrawlConfig,
    FetchPolicy): the job's own flags."""

    seed: tuple[str, ...] = option((), "a seed URL (repeatable)")
    seeds: str | None = option(None, "file of seed URLs, one per line (# comments)")
    previous: str | None = option(None, "CrawlDB directory of an earlier crawl to re-crawl conditionally "
                                        "(default: --out, when it holds one)")
    include: tuple[str, ...] = option((), "regex: also in scope (repeatable)")
    exclude: tuple[str, ...] = option((), "regex: never in scope (repeatable)")
    max_pages: int = option(100_000, "page URLs scheduled at most")
    max_rounds: int = option(100, "fetch rounds (one Beam job each) at most")
    warc_shards: int = option(4, "WARC writers (files) per round")
    warc_max_bytes: int = option(128 * 1024 * 1024, "a WARC file is closed once it reaches this size")


class CrawlOptions(PipelineOptions):
    """What is crawled and how politely. The flags are the fields of CrawlJob,
    CrawlConfig and FetchPolicy: their defaults and help are defined there, once."""

    @classmethod
    def _add_argparse_args(cls, parser):
        for config in (CrawlJob, CrawlConfig, FetchPolicy):
            add_arguments(parser, config)


class CrawlJobOptions(CrawlOptions, BuildOptions, PublishOptions):
    """Every flag the crawl reads (--out comes from BuildOptions, --break_lock from PublishOptions)."""


FLAGS: JobFlags = {CrawlOptions: None, BuildOptions: ("out",), PublishOptions: ("break_lock",)}


def read_seeds(job: CrawlJob) -> tuple[list[str], list[dict]]:
    """(clean seed URLs, bad_url CrawlDB rows of the malformed ones)."""
    raw = list(job.seed)
    if job.seeds:
        with open_read(job.seeds) as fh:
            raw += [line.strip() for line in fh.read().decode("utf-8").splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    seeds, bad = [], []
    for text in raw:
        try:
            seeds.append(clean_url(text))
        except BadUrl as exc:
            LOG.error("bad seed: %s", exc)
            bad.append(crawldb_row(CrawlTarget(text), "bad_url", "", error=str(exc)))
    return seeds, bad


def crawl_config(opts: CrawlJobOptions, job: CrawlJob, seeds: list[str]) -> CrawlConfig:
    return from_arguments(CrawlConfig, opts, policy=from_arguments(FetchPolicy, opts),
                          scope=Scope.for_seeds(seeds, job.include, job.exclude))


def parquet_sink(prefix: str, schema, **kwargs) -> beam.io.WriteToParquet:
    return beam.io.WriteToParquet(prefix, schema, file_name_suffix=".parquet", codec="zstd", **kwargs)


def round_dir(work: str, number: int) -> str:
    return os.path.join(work, f"r{number:02d}")


def targets_pattern(work: str, number: int) -> str:
    return os.path.join(round_dir(work, number), "targets-*.parquet")


def resting_prefix(work: str) -> str:
    """Round 0 writes here the failed pages not due this crawl: every round counts them as scheduled."""
    return os.path.join(round_dir(work, 0), RESTING)


def count_rows(pattern: str) -> int:
    """Rows of the Parquet files matching `pattern` (their footers only)."""
    return sum(open_parquet(path).metadata.num_rows for path in match_files(pattern))


def accounting_mismatch(keyed: tuple[str, dict]) -> list[str]:
    """A round's URL whose number of targets and of page rows differ (each target
    must end as exactly one page row)."""
    url, groups = keyed
    wanted, got = sum(groups["targets"]), sum(groups["rows"])
    return [] if wanted == got else [json.dumps({"url": url, "targets": wanted, "rows": got})]


def round_pipeline(p: beam.Pipeline, number: int, work: str, seed_targets: list[dict], previous_dir: str,
                   scheduled_before: int, config: CrawlConfig, robots: dict[str, RobotsRules], warc_dir: str,
                   crawl_id: str, job: CrawlJob, round_urls: int | None = None) -> None:
    """One round: [generate] -> fetch grouped by host -> store per shard ->
    generate the next fetch list. Everything it produces goes to files under
    round_dir(work, number) and targets of the next round's directory.
    `round_urls`, the URLs the previous round scheduled for this one (None for
    the first, whose list this job generates), is the fetch progress's total."""
    here = round_dir(work, number)
    if number == 0:
        if exists(crawldb_path(previous_dir)):
            revisits = (p | "PreviousCrawlDb" >> beam.io.ReadFromParquet(crawldb_path(previous_dir))
                        | "Revisits" >> beam.FlatMap(revisit_record).with_outputs(RESTING, main="due"))
            previous, resting = revisits["due"], revisits[RESTING]
        else:
            previous = p | "NoPrevious" >> beam.Create([])
            resting = p | "NoneResting" >> beam.Create([])
        # written even when empty: later rounds read it
        resting | "WriteResting" >> parquet_sink(resting_prefix(work), RESTING_SCHEMA, num_shards=1)
        candidates = (previous, p | "Seeds" >> beam.Create(seed_targets)) | "Candidates" >> beam.Flatten()
        targets = candidates | "GenerateFirst" >> Generate(p | "NoneScheduled" >> beam.Create([]),
                                                           p | "Room" >> beam.Create([job.max_pages]))
        targets | "WriteTargets" >> parquet_sink(os.path.join(here, "targets"), CRAWL_TARGET_SCHEMA)
    else:
        targets = p | "ReadTargets" >> beam.io.ReadFromParquet(targets_pattern(work, number))
        resting = p | "ReadResting" >> beam.io.ReadFromParquet(resting_prefix(work) + "*.parquet")
    fetched = (targets
               | "ToTarget" >> beam.Map(record_target)
               | "KeyByHost" >> beam.Map(lambda t: (origin_of(t.url), t))
               | "GroupByHost" >> beam.GroupByKey()
               | "FetchHost" >> beam.ParDo(FetchHostFn(config, robots)).with_outputs(LINKS, ROBOTS, main="outcomes"))
    rows = record_counts(fetched["outcomes"]
                         | "FetchProgress" >> LogProgress(f"round {number} fetch (URLs)", round_urls)
                         | "KeyByShard" >> beam.Map(shard_key, job.warc_shards)
                         | "GroupByShard" >> beam.GroupByKey()
                         | "Store" >> beam.ParDo(StoreShardFn(warc_dir, f"{crawl_id}-r{number:02d}", crawl_id,
                                                              job.warc_max_bytes)).with_outputs(COUNTS, main="rows")
                         ).rows
    rows | "WriteRows" >> parquet_sink(os.path.join(here, "rows"), CRAWLDB_SCHEMA)
    ({"targets": targets | "TargetUrls" >> beam.Map(lambda r: (r["url"], 1)),
      "rows": rows | "PageRows" >> beam.FlatMap(lambda r: [(r["url"], 1)] if r["kind"] == "page" else [])}
     | "JoinAccounting" >> beam.CoGroupByKey()
     | "Mismatches" >> beam.FlatMap(accounting_mismatch)
     # skip_if_empty: an empty object is no multipart upload S3 accepts (Beam's S3 writer fails on it)
     | "WriteMismatches" >> beam.io.WriteToText(os.path.join(here, "mismatches"), ".jsonl", skip_if_empty=True))
    (fetched[ROBOTS]  # one (host, rules) per host new in this round: O(hosts)
     | "RobotsToList" >> beam.combiners.ToList()
     | "WriteRobots" >> beam.Map(lambda pairs: write_bytes(
         os.path.join(here, "robots.json"),
         json.dumps({host: dataclasses.asdict(rules) for host, rules in pairs}).encode())))
    earlier = [targets_pattern(work, n) for n in range(number)]
    scheduled = ((p | "EarlierTargets" >> beam.Create(earlier)
                  | "ReadEarlier" >> beam.io.ReadAllFromParquet(columns=["url"]),
                  targets, resting) | "Scheduled" >> beam.Flatten() | "ScheduledKeys" >> beam.Map(lambda r: crawl_key(r["url"])))
    limit = job.max_pages - scheduled_before
    room = (targets | "CountTargets" >> beam.combiners.Count.Globally()
            | "NextRoom" >> beam.Map(lambda n: limit - n))
    (fetched[LINKS]
     | "LinkRecords" >> beam.Map(lambda link: target_record(link.target, link.via))
     | "GenerateNext" >> Generate(scheduled, room)
     | "WriteNext" >> parquet_sink(os.path.join(round_dir(work, number + 1), "targets"), CRAWL_TARGET_SCHEMA))
    p | "WriteCounts" >> WriteCounts(here)  # the round's row counts, as data (transforms/counts.py)


def run_job(options: PipelineOptions, build) -> None:
    """Run one Beam job built by `build(p)`."""
    p = beam.Pipeline(options=options)
    build(p)
    p.run().wait_until_finish()


def check_round(here: str, number: int) -> None:
    """Every target of a round ended as exactly one page row, or the crawl stops
    before the CrawlDB is written."""
    bad = [line for path in match_files(os.path.join(here, "mismatches*"))
           for line in read_text(path).splitlines()]
    if bad:
        raise RuntimeError(f"round {number}: crawl accounting mismatch for {len(bad)} URLs "
                           f"(e.g. {bad[:3]}); CrawlDB not written")


def read_robots(here: str) -> dict[str, RobotsRules]:
    return {host: RobotsRules(**d) for host, d in json.loads(read_text(os.path.join(here, "robots.json"))).items()}


def read_text(path: str) -> str:
    with open_read(path) as fh:
        return fh.read().decode("utf-8")


def previous_seeds(previous_dir: str) -> list[str]:
    """The pages an earlier crawl started from (depth 0): a re-crawl's scope when no seed is given."""
    return sorted({r["url"] for r in scan_crawldb(previous_dir, ["url", "kind", "depth"])
                   if r["kind"] == "page" and r["depth"] == 0})


def run(argv: list[str] | None = None) -> dict[str, int]:
    """Run a crawl; returns the count of CrawlDB rows of this crawl by kind and status."""
    options = job_options(argv, FLAGS)
    opts = options.view_as(CrawlJobOptions)
    if not opts.out:
        raise ValueError("missing required option: --out")
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = "FnApiRunner"
    job = from_arguments(CrawlJob, opts)
    seeds, bad_rows = read_seeds(job)
    previous_dir = job.previous or opts.out
    scope_seeds = seeds or previous_seeds(previous_dir)
    if not scope_seeds:
        raise ValueError("no valid seed URL (give --seed URL or --seeds FILE)" +
                         (f"; {len(bad_rows)} malformed" if bad_rows else ""))
    make_dirs(opts.out)
    with IndexLease(IndexLayout(opts.out), "crawl", opts.break_lock):
        return crawl(options, job, opts.out, seeds, bad_rows, previous_dir, crawl_config(opts, job, scope_seeds))


def crawl(options: PipelineOptions, job: CrawlJob, out: str, seeds: list[str], bad_rows: list[dict],
          previous_dir: str, config: CrawlConfig) -> dict[str, int]:
    """The rounds and the CrawlDB update into crawl directory `out`, under its lease."""
    crawl_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    warc_dir = os.path.join(out, WARC_DIR)
    work = os.path.join(out, ROUNDS_DIR, crawl_id)
    make_dirs(warc_dir)
    seed_targets = [target_record(CrawlTarget(s), "seed") for s in dict.fromkeys(seeds)]
    counts: Counter = Counter(f"{r['kind']}_{r['status']}" for r in bad_rows)
    robots: dict[str, RobotsRules] = {}
    scheduled, started, number, upcoming = 0, time.time(), 0, None
    LOG.info("crawl %s: %d seeds, re-visiting %s, scope %s", crawl_id, len(seeds),
             crawldb_path(previous_dir) if exists(crawldb_path(previous_dir)) else "nothing",
             ", ".join(config.scope.prefixes))
    for number in range(job.max_rounds):
        here = round_dir(work, number)
        make_dirs(here)
        run_job(options, lambda p: round_pipeline(
            p, number, work, seed_targets, previous_dir, scheduled, config, dict(robots), warc_dir, crawl_id, job,
            upcoming))
        counts.update(read_counts(here))  # its CrawlDB rows by kind_status (StoreShardFn)
        check_round(here, number)
        robots.update(read_robots(here))
        fetched = count_rows(targets_pattern(work, number))
        scheduled += fetched
        upcoming = count_rows(targets_pattern(work, number + 1))
        LOG.info("round %d: %d URLs fetched, %d new URLs for the next round, %d scheduled, %.0f s", number,
                 fetched, upcoming, scheduled, time.time() - started)
        if not upcoming:
            break
    rows_patterns = [os.path.join(round_dir(work, n), "rows-*.parquet") for n in range(number + 1)]
    hops = redirect_hops(previous_dir, (r for pattern in rows_patterns for path in match_files(pattern)
                                        for batch in open_parquet(path).iter_batches(
                                            columns=["url", "kind", "status", "final_url"])
                                        for r in batch.to_pylist() if r["kind"] == "page"))
    update_crawldb(options, previous_dir, out, rows_patterns, bad_rows, hops)
    if dir_exists(work):
        remove_tree(work)
    pages = sum(n for k, n in counts.items() if k.startswith("page_"))
    LOG.info("crawl accounting: %d page URLs scheduled = %s; %s; %.1f s (%.1f pages/s)",
             pages - len(bad_rows), " + ".join(f"{k[5:]} {n}" for k, n in sorted(counts.items())
                                              if k.startswith("page_") and k != "page_bad_url"),
             ", ".join(f"{k} {n}" for k, n in sorted(counts.items()) if not k.startswith("page_")
                       or k == "page_bad_url"),
             time.time() - started, pages / max(time.time() - started, 1e-9))
    return dict(counts)


def update_crawldb(options: PipelineOptions, previous_dir: str, out: str, rows_patterns: list[str],
                   bad_rows: list[dict], hops: dict[str, str]) -> None:
    """The last job: this crawl's rows over the previous CrawlDB, written aside
    as one file and moved over CRAWL_DIR/crawldb.parquet."""
    path = crawldb_path(out)
    tmp = path + ".tmp"

    def build(p: beam.Pipeline) -> None:
        previous = (p | "ReadPrevious" >> beam.io.ReadFromParquet(crawldb_path(previous_dir))
                    if exists(crawldb_path(previous_dir)) else p | "NoPrevious" >> beam.Create([]))
        current = ((p | "RowFiles" >> beam.Create(rows_patterns) | "ReadRows" >> beam.io.ReadAllFromParquet(),
                    p | "BadSeeds" >> beam.Create(bad_rows)) | "Current" >> beam.Flatten())
        ({"previous": previous, "current": current}
         | "Update" >> UpdateCrawlDb(hops)
         | "Write" >> parquet_sink(tmp, CRAWLDB_SCHEMA, num_shards=1, shard_name_template=""))

    run_job(options, build)
    replace_file(tmp + ".parquet", path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()
