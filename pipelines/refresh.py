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

import logging

from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.pipelines import build, crawl, update
from ritrag.pipelines.update import UpdateOptions
from ritrag.layout import IndexLayout

LOG = logging.getLogger("ritrag.refresh")


class RefreshOptions(UpdateOptions):
    """--index (UpdateOptions': updated, or built if it has no version yet) and --crawl_dir."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--crawl_dir", help="crawl directory (CrawlDB + WARC files), re-crawled in place")


def run(argv: list[str] | None = None) -> dict:
    """Crawl, then update (or build) the index; returns {"crawl": row counts,
    "index", "version": the published version, "built": whether it was a first build}.
    Every other flag goes to the jobs (each reads the ones it knows)."""
    argv = list(argv or [])
    opts = PipelineOptions(argv).view_as(RefreshOptions)
    if not opts.crawl_dir or not opts.index:
        raise ValueError("missing required option: --crawl_dir and --index")
    counts = crawl.run([*argv, "--out", opts.crawl_dir])
    first = IndexLayout(opts.index).current_version() is None
    if first:
        version = build.run([*argv, "--input", opts.crawl_dir, "--out", opts.index])
    else:
        version = update.run([*argv, "--input", opts.crawl_dir, "--index", opts.index])
    LOG.info("refresh: crawled %s, %s %s, published %s", opts.crawl_dir, "built" if first else "updated",
             opts.index, version)
    return {"crawl": counts, "index": opts.index, "version": version, "built": first}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()
