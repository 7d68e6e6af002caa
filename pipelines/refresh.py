"""The scheduled loop in one command: crawl -> update -> publish.

    python -m ritrag.pipelines.refresh --seed URL [--seed URL ...] [--seeds FILE] --crawl_dir CRAWL_DIR --index INDEX
        [crawl options: pipelines/crawl.py] [build/update options] [runner options]

The crawl re-visits CRAWL_DIR with conditional GETs (the first run crawls from
the seeds); then the index is updated from the crawl directory -- or built, when
INDEX has no published version yet -- and the new version published, which
serving replicas pick up. Each job takes its own lease (the crawl directory's,
then the index's), so two refreshes of the same crawl or index never overlap.

Nothing changed at the source: every page is `unchanged` (304 or same sha256),
no WARC record is written, and the update publishes a new version whose one new
segment is an empty delta (0 pages indexed, 0 chunks added).
"""
from __future__ import annotations

import dataclasses
import logging
import sys

from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.pipelines import build, crawl, update
from ritrag.pipelines.options import JobFlags, JobOptionsError, check_job_argv, job_actions, job_flags, merge_flags
from ritrag.flags import add_arguments, option
from ritrag.layout import IndexLayout

LOG = logging.getLogger("ritrag.refresh")


@dataclasses.dataclass(frozen=True)
class RefreshedCrawl:
    """The crawl directory a refresh keeps: its flag."""

    crawl_dir: str | None = option(None, "crawl directory (CrawlDB + WARC files), re-crawled in place")


class RefreshOptions(PipelineOptions):
    """The crawl directory the refresh keeps (--index is the update's)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_arguments(parser, RefreshedCrawl)


# One command line for the three jobs, each handed only its own flags (and every
# Beam flag); the jobs' --out and --input are the refresh's two directories.
FLAGS: JobFlags = merge_flags({RefreshOptions: None}, crawl.FLAGS, build.FLAGS, update.FLAGS, without=("out", "input"))


def run(argv: list[str] | None = None) -> dict:
    """Crawl, then update (or build) the index; returns {"crawl": row counts,
    "index", "version": the published version (the live one where no page
    changed), "built": whether it was a first build}."""
    argv = sys.argv[1:] if argv is None else list(argv)
    namespace, beam_flags = check_job_argv(argv, FLAGS)
    if not namespace.crawl_dir or not namespace.index:
        raise JobOptionsError("missing required option: --crawl_dir and --index")
    def flags_of(job) -> list[str]:
        return [*job_flags(namespace, job_actions(job.FLAGS)), *beam_flags]

    counts = crawl.run([*flags_of(crawl), "--out", namespace.crawl_dir])
    live = IndexLayout(namespace.index).current_version()
    if live is None:
        version = build.run([*flags_of(build), "--input", namespace.crawl_dir, "--out", namespace.index])
    else:
        version = update.run([*flags_of(update), "--input", namespace.crawl_dir, "--index", namespace.index])
    LOG.info("refresh: crawled %s, %s %s, %s %s", namespace.crawl_dir, "built" if live is None else "updated",
             namespace.index, "no page changed:" if version == live else "published", version)
    return {"crawl": counts, "index": namespace.index, "version": version, "built": live is None}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()
